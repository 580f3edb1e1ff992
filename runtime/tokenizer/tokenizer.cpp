// Tokenizer: building the lookup tables, encode (special-token split, pre-tokenizer, BPE) and
// decode. Loading from GGUF / tokenizer.json lives in tokenizer_load.cpp.
#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "runtime/tokenizer/tokenizer_internal.h"

namespace troupe {

using tokenizer_detail::Kind;
using tokenizer_detail::TokenType;
using tokenizer_detail::Vocab;

namespace tokenizer_detail {

namespace {
std::string sentencepiece_unescape(std::string_view s) {
  static const std::string kSpace = "\xE2\x96\x81";  // U+2581 "▁"
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// "<0x41>" -> 0x41; -1 if `s` is not a byte token.
int parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(s[3]), lo = hex(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Token texts that end a turn in the chat formats we know (llama.cpp uses the same list).
bool is_eog_text(const std::string& t) {
  static const char* const kEog[] = {"<|eot_id|>",
                                     "<|im_end|>",
                                     "<|end|>",
                                     "<end_of_turn>",
                                     "<|endoftext|>",
                                     "<|end_of_text|>",
                                     "<|eom_id|>",
                                     "<EOT>",
                                     "_<EOT>",
                                     "<\xEF\xBD\x9C"
                                     "end\xE2\x96\x81"
                                     "of\xE2\x96\x81"
                                     "sentence\xEF\xBD\x9C>"};
  for (const char* e : kEog) {
    if (t == e) return true;
  }
  return false;
}
}  // namespace

Result<std::shared_ptr<const Vocab>> build_vocab(VocabSpec spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return make_error("tokenizer: the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return make_error("tokenizer: vocabulary too large");
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return make_error("tokenizer: " + std::to_string(spec.scores.size()) + " scores for " + std::to_string(n) +
                      " tokens");
  }
  if (!spec.types.empty() && spec.types.size() != n) {
    return make_error("tokenizer: " + std::to_string(spec.types.size()) + " token types for " + std::to_string(n) +
                      " tokens");
  }
  auto check_id = [&](int64_t id, const char* what) -> Status {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return make_error(std::string("tokenizer: ") + what + " id " + std::to_string(id) +
                        " is outside the vocabulary [0, " + std::to_string(n) + ")");
    }
    return {};
  };
  TROUPE_TRY(check_id(spec.bos, "bos"));
  TROUPE_TRY(check_id(spec.eos, "eos"));
  TROUPE_TRY(check_id(spec.unk, "unk"));
  for (int64_t id : spec.extra_eog) TROUPE_TRY(check_id(id, "end-of-generation"));

  auto v = std::make_shared<Vocab>();
  v->kind = spec.kind;
  v->bos = static_cast<int32_t>(spec.bos);
  v->eos = static_cast<int32_t>(spec.eos);
  v->unk = static_cast<int32_t>(spec.unk);
  v->add_bos = spec.add_bos && v->bos >= 0;
  v->add_eos = spec.add_eos && v->eos >= 0;
  v->add_space_prefix = spec.add_space_prefix;
  v->ignore_merges = spec.ignore_merges;
  v->tokens = std::move(spec.tokens);
  v->scores = std::move(spec.scores);
  v->types = spec.types.empty() ? std::vector<TokenType>(n, TokenType::normal) : std::move(spec.types);
  for (auto& t : v->types) {
    if (static_cast<int32_t>(t) < 0 || static_cast<int32_t>(t) > 6) t = TokenType::undefined;
  }

  v->bytes.resize(n);
  v->eog.assign(n, 0);
  v->byte_token.fill(-1);
  v->token_to_id.reserve(n * 2);
  const auto& alphabet = tokenizer_detail::byte_to_unicode();
  std::unordered_map<std::string, int> alphabet_index;
  for (int b = 0; b < 256; ++b) alphabet_index.emplace(alphabet[b], b);

  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v->tokens[i];
    const auto id = static_cast<int32_t>(i);
    const TokenType type = v->types[i];
    if (!t.empty()) v->token_to_id.emplace(t, id);  // first one wins on duplicates, like HF
    if (type == TokenType::control || type == TokenType::user_defined) {
      v->bytes[i] = t;  // added tokens are stored as plain text
    } else if (v->kind == Kind::byte_level_bpe) {
      v->bytes[i] = byte_level_decode(t);
      auto it = alphabet_index.find(t);
      if (it != alphabet_index.end() && v->byte_token[it->second] < 0) v->byte_token[it->second] = id;
    } else {
      int b = parse_byte_token(t);
      if (b >= 0 && (type == TokenType::byte || type == TokenType::normal || type == TokenType::undefined)) {
        v->bytes[i] = std::string(1, static_cast<char>(b));
        if (v->byte_token[b] < 0) v->byte_token[b] = id;
      } else {
        v->bytes[i] = sentencepiece_unescape(t);
      }
    }
    if ((type == TokenType::control || type == TokenType::user_defined) && !t.empty()) {
      v->added_by_first_byte[static_cast<uint8_t>(t[0])].push_back(id);
    }
    if (type == TokenType::control && is_eog_text(t)) v->eog[i] = 1;
  }
  for (auto& list : v->added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(),
                     [&](int32_t a, int32_t b) { return v->tokens[a].size() > v->tokens[b].size(); });
  }
  if (v->eos >= 0) v->eog[v->eos] = 1;
  for (int64_t id : spec.extra_eog) {
    if (id >= 0) v->eog[id] = 1;
  }

  v->merges.reserve(spec.merges.size() * 2);
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [left, right] = spec.merges[r];
    auto l = v->token_to_id.find(left);
    auto rt = v->token_to_id.find(right);
    auto m = v->token_to_id.find(left + right);
    if (l == v->token_to_id.end() || rt == v->token_to_id.end() || m == v->token_to_id.end()) {
      return make_error("tokenizer: merge " + std::to_string(r) + " ('" + left + "' '" + right +
                        "') names a token that is not in the vocabulary");
    }
    if (r > static_cast<size_t>(INT32_MAX)) return make_error("tokenizer: too many merges");
    // The first (lowest-rank) rule for a pair wins, as in HF tokenizers.
    v->merges.emplace(tokenizer_detail::pair_key(l->second, rt->second),
                      tokenizer_detail::MergeRule{static_cast<int32_t>(r), m->second});
  }
  if (v->kind == Kind::byte_level_bpe && v->merges.empty() && n > 256) {
    return make_error("tokenizer: byte-level BPE vocabulary has no merges");
  }
  if (v->kind == Kind::byte_level_bpe) {
    auto pre = compile_pre_tokenizer(spec.pre_patterns);
    if (!pre) return pre.error();
    v->pre = std::move(*pre);
  }
  return std::shared_ptr<const Vocab>(std::move(v));
}

}  // namespace tokenizer_detail

namespace {

struct Fragment {
  std::string_view text;  // raw text when token < 0
  int32_t token = -1;
};

// Cuts added tokens out of `text`: leftmost match first, longest at a position. CONTROL tokens
// only when parse_special; USER_DEFINED tokens always (as llama.cpp does).
std::vector<Fragment> split_added_tokens(const Vocab& v, std::string_view text, bool parse_special) {
  std::vector<Fragment> out;
  size_t raw_start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t found = -1;
    for (int32_t id : v.added_by_first_byte[static_cast<uint8_t>(text[i])]) {
      if (!parse_special && v.types[id] == TokenType::control) continue;
      const std::string& t = v.tokens[id];
      if (text.compare(i, t.size(), t) == 0) {
        found = id;
        break;  // longest first
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    if (i > raw_start) out.push_back({text.substr(raw_start, i - raw_start), -1});
    out.push_back({{}, found});
    i += v.tokens[found].size();
    raw_start = i;
  }
  if (raw_start < text.size()) out.push_back({text.substr(raw_start), -1});
  return out;
}

void encode_byte_level(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  constexpr size_t kMaxCache = 1 << 16;
  constexpr size_t kMaxCachedWord = 128;  // long words rarely repeat; keep the cache small
  for (std::string_view word : v.pre.split(text)) {
    if (v.ignore_merges) {
      auto it = v.token_to_id.find(tokenizer_detail::byte_level_encode(word));
      if (it != v.token_to_id.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    if (word.size() > kMaxCachedWord) {
      tokenizer_detail::bpe_encode_word(v, word, out);
      continue;
    }
    std::string key(word);
    {
      std::lock_guard<std::mutex> lock(v.cache_mu);
      auto it = v.cache.find(key);
      if (it != v.cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    std::vector<int32_t> ids;
    tokenizer_detail::bpe_encode_word(v, word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(v.cache_mu);
    if (v.cache.size() >= kMaxCache) v.cache.clear();
    v.cache.emplace(std::move(key), std::move(ids));
  }
}

void encode_sentencepiece(const Vocab& v, std::string_view text, bool prefix_space, std::vector<int32_t>& out) {
  static const std::string kSpace = "\xE2\x96\x81";
  std::string escaped;
  escaped.reserve(text.size() + 8);
  if (prefix_space) escaped += kSpace;
  for (char c : text) {
    if (c == ' ') {
      escaped += kSpace;
    } else {
      escaped += c;
    }
  }
  tokenizer_detail::bpe_encode_word(v, escaped, out);
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Vocab& v = *v_;
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = sanitize_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && v.add_bos) out.push_back(v.bos);
  bool is_prev_special = true;  // SentencePiece: prefix "▁" at the start and after added tokens
  for (const Fragment& f : split_added_tokens(v, text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      is_prev_special = true;
      continue;
    }
    if (v.kind == Kind::byte_level_bpe) {
      encode_byte_level(v, f.text, out);
    } else {
      encode_sentencepiece(v, f.text, v.add_space_prefix && is_prev_special, out);
    }
    is_prev_special = false;
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const Vocab& v = *v_;
  std::string out;
  bool is_first = true;
  for (int32_t id : ids) {
    if (!v.in_range(id)) continue;
    if (skip_special && v.types[id] == TokenType::control) continue;
    const std::string& piece = v.bytes[id];
    if (is_first && !piece.empty()) {
      is_first = false;
      if (strips_leading_space() && piece[0] == ' ') {
        out.append(piece, 1);
        continue;
      }
    }
    out += piece;
  }
  // Byte tokens that do not form whole characters: U+FFFD, as HF's decode does.
  return is_valid_utf8(out) ? out : sanitize_utf8(out);
}

std::string Tokenizer::token_text(int32_t id) const { return v_->in_range(id) ? v_->bytes[id] : std::string(); }
int32_t Tokenizer::vocab_size() const { return v_->size(); }
int32_t Tokenizer::bos_id() const { return v_->bos; }
int32_t Tokenizer::eos_id() const { return v_->eos; }
bool Tokenizer::is_eog(int32_t id) const { return v_->in_range(id) && v_->eog[id] != 0; }
bool Tokenizer::is_special(int32_t id) const { return v_->in_range(id) && v_->types[id] == TokenType::control; }
bool Tokenizer::add_bos() const { return v_->add_bos; }
bool Tokenizer::add_eos() const { return v_->add_eos; }
int32_t Tokenizer::find_token(std::string_view stored_text) const {
  auto it = v_->token_to_id.find(std::string(stored_text));
  return it == v_->token_to_id.end() ? -1 : it->second;
}
bool Tokenizer::strips_leading_space() const { return v_->kind == Kind::sentencepiece_bpe && v_->add_space_prefix; }

}  // namespace troupe
