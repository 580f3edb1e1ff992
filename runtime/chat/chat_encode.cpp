#include "runtime/chat/chat_encode.h"

#include <random>

namespace troupe {

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  const std::string bos = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "";
  auto text = tmpl.render(messages, add_generation_prompt, bos, eos);
  if (!text) return make_error("chat template: " + text.error().message);
  bool special_in_content = false;
  for (const auto& m : messages)
    if (tok.encode(m.content, false, true) != tok.encode(m.content, false, false)) special_in_content = true;
  if (!special_in_content) return tok.encode(*text, true, true);

  if (tok.strips_leading_space())
    return make_error(
        "message content contains special-token text, which this model's tokenizer cannot keep as "
        "text inside a chat prompt");
  // Placeholders: a per-request random nonce, so no content can forge one.
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::vector<std::string> marks;
  std::vector<ChatMessage> masked = messages;
  for (size_t i = 0; i < masked.size(); ++i) {
    marks.push_back(
        "\x1e"
        "troupe-content-" +
        std::to_string(nonce) + "-" + std::to_string(i) + "\x1f");
    masked[i].content = marks.back();
  }
  auto shape = tmpl.render(masked, add_generation_prompt, bos, eos);
  if (!shape) return make_error("chat template: " + shape.error().message);
  // Cut the rendered shape at the placeholders; each must appear once, in order.
  struct Piece {
    std::string text;
    bool content;
  };
  std::vector<Piece> pieces;
  std::string rebuilt;
  size_t at = 0;
  for (size_t i = 0; i < marks.size(); ++i) {
    const size_t p = shape->find(marks[i], at);
    if (p == std::string::npos || shape->find(marks[i], p + 1) != std::string::npos)
      return make_error(
          "message content contains special-token text, and this model's chat template transforms "
          "content, so it cannot be kept as text");
    pieces.push_back({shape->substr(at, p - at), false});
    pieces.push_back({messages[i].content, true});
    at = p + marks[i].size();
  }
  pieces.push_back({shape->substr(at), false});
  for (const auto& pc : pieces) rebuilt += pc.text;
  if (rebuilt != *text)  // the template used the content other than by inserting it
    return make_error(
        "message content contains special-token text, and this model's chat template transforms "
        "content, so it cannot be kept as text");
  std::vector<int32_t> out = tok.encode("", true, false);  // BOS (and EOS) when the model adds them
  std::vector<int32_t> tail;
  if (tok.add_eos() && !out.empty() && out.back() == tok.eos_id()) {
    tail.push_back(out.back());
    out.pop_back();
  }
  for (const auto& pc : pieces) {
    if (pc.text.empty()) continue;
    const auto ids = tok.encode(pc.text, false, !pc.content);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

}  // namespace troupe
