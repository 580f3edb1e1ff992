// Pre-tokenizer regexes (PCRE2), GPT-2's byte alphabet, and the BPE merge loop.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <queue>

#include "common/utf8.h"
#include "runtime/tokenizer/tokenizer_internal.h"

namespace troupe::tokenizer_detail {

// ---- regexes ----

Result<Regex> Regex::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &err_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return make_error("tokenizer: cannot compile pre-tokenizer regex at offset " + std::to_string(err_offset) + ": " +
                      reinterpret_cast<char*>(msg) + " (pattern: " + pattern + ")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; interpreter if it fails
  Regex r;
  r.code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
  return r;
}

void Regex::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                    pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap_start = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc < 0) break;  // no further match (or a match error: the rest becomes one gap)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t start = ov[0], end = ov[1];
    if (start < pos || end < start || end > text.size()) break;  // cannot happen; stay safe
    if (end == start) {  // empty match: step one code point so the loop always advances
      pos = start + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > gap_start) out.emplace_back(gap_start, start);
    out.emplace_back(start, end);
    pos = gap_start = end;
  }
  if (gap_start < text.size()) out.emplace_back(gap_start, text.size());
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> pieces{{0, text.size()}}, next;
  for (const Regex& re : regexes) {
    next.clear();
    std::vector<std::pair<size_t, size_t>> sub;
    for (auto [b, e] : pieces) {
      sub.clear();
      re.split(text.substr(b, e - b), sub);
      for (auto [sb, se] : sub) next.emplace_back(b + sb, b + se);
    }
    pieces.swap(next);
  }
  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (auto [b, e] : pieces) {
    if (e > b) words.push_back(text.substr(b, e - b));
  }
  return words;
}

namespace {
// HF tokenizers' ByteLevel regex (GPT-2), and the Llama 3 / Qwen2 variants from their
// tokenizer.json files; llama.cpp's llama-vocab.cpp maps tokenizer.ggml.pre names to these.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDigit = R"(\p{N})";
}  // namespace

Result<std::vector<std::string>> pre_tokenizer_patterns(const std::string& pre) {
  if (pre.empty() || pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre == "mpt" || pre == "olmo" ||
      pre == "jais") {
    return std::vector<std::string>{kGpt2};
  }
  if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "dbrx" || pre == "smaug-bpe" ||
      pre == "falcon3" || pre == "pixtral") {
    return std::vector<std::string>{kLlama3};
  }
  if (pre == "qwen2" || pre == "qwen2.5" || pre == "qwen-2.5" || pre == "deepseek-r1-qwen" || pre == "stablelm2") {
    return std::vector<std::string>{kQwen2};
  }
  // SmolLM (like StarCoder): every digit on its own, then the GPT-2 regex.
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell" ||
      pre == "exaone" || pre == "minerva-7b") {
    return std::vector<std::string>{kDigit, kGpt2};
  }
  return make_error("tokenizer: unsupported tokenizer.ggml.pre '" + pre +
                    "' (known: gpt2, llama-bpe/llama3, qwen2, smollm, starcoder, ...)");
}

Result<PreTokenizer> compile_pre_tokenizer(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  for (const auto& pat : patterns) {
    auto re = Regex::compile(pat);
    if (!re) return re.error();
    p.regexes.push_back(std::move(*re));
  }
  return p;
}

// ---- GPT-2 byte alphabet ----

namespace {

// Printable bytes map to themselves; the other 68 get code points 256, 257, ... in byte order.
std::array<uint32_t, 256> make_byte_code_points() {
  std::array<uint32_t, 256> cps{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cps[b] = printable ? b : next++;
  }
  return cps;
}
}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    auto cps = make_byte_code_points();
    for (int b = 0; b < 256; ++b) append_utf8(t[b], cps[b]);
    return t;
  }();
  return table;
}

std::string byte_level_encode(std::string_view bytes) {
  const auto& table = byte_to_unicode();
  std::string s;
  s.reserve(bytes.size() * 2);
  for (char c : bytes) s += table[static_cast<uint8_t>(c)];
  return s;
}

std::string byte_level_decode(std::string_view spelled) {
  // All alphabet code points are below 0x144 (two UTF-8 bytes at most).
  static const std::array<int16_t, 0x200> inverse = [] {
    std::array<int16_t, 0x200> inv;
    inv.fill(-1);
    auto cps = make_byte_code_points();
    for (int b = 0; b < 256; ++b) inv[cps[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  std::string out;
  out.reserve(spelled.size());
  size_t i = 0;
  while (i < spelled.size()) {
    auto c0 = static_cast<uint8_t>(spelled[i]);
    if (c0 < 0x80) {
      out += inverse[c0] >= 0 ? static_cast<char>(inverse[c0]) : static_cast<char>(c0);
      ++i;
      continue;
    }
    if ((c0 & 0xE0) == 0xC0 && i + 1 < spelled.size()) {
      uint32_t cp = ((c0 & 0x1Fu) << 6) | (static_cast<uint8_t>(spelled[i + 1]) & 0x3Fu);
      if (cp < inverse.size() && inverse[cp] >= 0) {
        out += static_cast<char>(inverse[cp]);
        i += 2;
        continue;
      }
    }
    // Not in the alphabet (e.g. an added token spelled in plain UTF-8): keep the bytes as they are.
    size_t len = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC0 ? 2 : 1;
    len = std::min(len, spelled.size() - i);
    out.append(spelled.substr(i, len));
    i += len;
  }
  return out;
}

// ---- BPE merge loop ----

namespace {
struct Symbol {
  uint32_t start = 0, len = 0;  // bytes of `word`; len 0 once merged away
  int32_t prev = -1, next = -1;
  int32_t id = -1;  // -1: a character that is not in the vocabulary
};

struct Candidate {
  double priority;  // lower merges first (rank, or -score)
  int32_t left, right;
  uint32_t size;  // bytes of the merged symbol, to spot stale candidates
  int32_t result;
  bool operator>(const Candidate& o) const { return priority != o.priority ? priority > o.priority : left > o.left; }
};

size_t utf8_len(uint8_t c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }
}  // namespace

void bpe_encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out) {
  const bool by_score = v.kind == Kind::sentencepiece_bpe && !v.scores.empty();
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  for (size_t i = 0; i < word.size();) {
    Symbol s;
    s.start = static_cast<uint32_t>(i);
    if (v.kind == Kind::byte_level_bpe) {
      s.len = 1;  // the alphabet spells every byte as one character
      s.id = v.byte_token[static_cast<uint8_t>(word[i])];
    } else {
      s.len = static_cast<uint32_t>(std::min(utf8_len(static_cast<uint8_t>(word[i])), word.size() - i));
      auto it = v.token_to_id.find(std::string(word.substr(i, s.len)));
      s.id = it == v.token_to_id.end() ? -1 : it->second;
    }
    s.prev = static_cast<int32_t>(syms.size()) - 1;
    syms.push_back(s);
    i += s.len;
  }
  if (!syms.empty()) syms.back().next = -1;
  for (size_t i = 0; i + 1 < syms.size(); ++i) syms[i].next = static_cast<int32_t>(i + 1);

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  std::string scratch;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = syms[l];
    const Symbol& b = syms[r];
    if (by_score) {  // SentencePiece: any adjacent pair whose text is a token, best score first
      scratch.assign(word.substr(a.start, a.len + b.len));
      auto it = v.token_to_id.find(scratch);
      if (it == v.token_to_id.end()) return;
      queue.push({-static_cast<double>(v.scores[it->second]), l, r, a.len + b.len, it->second});
    } else {
      if (a.id < 0 || b.id < 0) return;
      auto it = v.merges.find(pair_key(a.id, b.id));
      if (it == v.merges.end()) return;
      queue.push({static_cast<double>(it->second.rank), l, r, a.len + b.len, it->second.result});
    }
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) try_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));

  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    Symbol& a = syms[c.left];
    Symbol& b = syms[c.right];
    // Stale when either side was merged away or grew since the candidate was queued.
    if (a.len == 0 || b.len == 0 || a.next != c.right || a.len + b.len != c.size) continue;
    a.len += b.len;
    a.id = c.result;
    a.next = b.next;
    if (b.next >= 0) syms[b.next].prev = c.left;
    b.len = 0;
    try_pair(a.prev, c.left);
    try_pair(c.left, a.next);
  }

  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    const Symbol& s = syms[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // Not a token. Byte-level: a byte whose character is missing from the vocabulary is dropped
    // (HF tokenizers and llama.cpp do the same; SmolLM2 lacks e.g. 0x04 and 0x14).
    // SentencePiece: <0xXX> per byte, else one <unk> for the character.
    if (v.kind == Kind::byte_level_bpe) continue;
    for (uint32_t k = 0; k < s.len; ++k) {
      int32_t bt = v.byte_token[static_cast<uint8_t>(word[s.start + k])];
      if (bt >= 0) {
        out.push_back(bt);
      } else if (v.unk >= 0) {
        out.push_back(v.unk);
        break;
      }
    }
  }
}

}  // namespace troupe::tokenizer_detail
