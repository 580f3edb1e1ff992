// Private to runtime/tokenizer_*.cpp: the loaded vocabulary and the pieces that encode with it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace troupe::tokenizer_detail {

// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

enum class Kind {
  byte_level_bpe,     // GPT-2 byte alphabet, merges by rank
  sentencepiece_bpe,  // "▁" for spaces, <0xXX> byte fallback, merges by score (or rank)
};

// A compiled PCRE2 pattern (UTF + UCP). Shared, immutable, thread-safe to match with.
class Regex {
 public:
  static Result<Regex> compile(const std::string& pattern);
  // Appends [start, end) byte ranges that cover `text`: every match and every gap between
  // matches (HF's Split behaviour "Isolated", llama.cpp's unicode_regex_split).
  // Precondition: text is valid UTF-8.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8, freed with pcre2_code_free_8
};

// The regex list of a pre-tokenizer, applied in order: each one splits the pieces of the last.
struct PreTokenizer {
  std::vector<Regex> regexes;
  // Splits valid UTF-8 text into words (views into `text`), none empty.
  std::vector<std::string_view> split(std::string_view text) const;
};

// Regexes for a GGUF tokenizer.ggml.pre name; error for names we do not know.
Result<std::vector<std::string>> pre_tokenizer_patterns(const std::string& pre_name);
Result<PreTokenizer> compile_pre_tokenizer(const std::vector<std::string>& patterns);

// GPT-2 bytes_to_unicode: byte -> UTF-8 spelling of its code point, and the inverse.
const std::array<std::string, 256>& byte_to_unicode();
std::string byte_level_encode(std::string_view bytes);
// Maps each code point back to its byte; code points outside the alphabet are kept as UTF-8.
std::string byte_level_decode(std::string_view spelled);

struct MergeRule {
  int32_t rank = 0;
  int32_t result = 0;
};

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Vocab {
  Kind kind = Kind::byte_level_bpe;
  std::vector<std::string> tokens;                       // [vocab] spelling as stored (byte alphabet / ▁ / <0xXX>)
  std::vector<std::string> bytes;                        // [vocab] decoded bytes of each token
  std::vector<float> scores;                             // [vocab] SentencePiece scores (empty: merges by rank)
  std::vector<TokenType> types;                          // [vocab]
  std::vector<uint8_t> eog;                              // [vocab] 1 for end-of-generation tokens
  std::unordered_map<std::string, int32_t> token_to_id;  // stored spelling -> id
  std::unordered_map<uint64_t, MergeRule> merges;        // pair_key(left, right) -> rule
  // Byte-level: byte -> id of its one-character token. SentencePiece: byte -> <0xXX> id. -1: none.
  std::array<int32_t, 256> byte_token{};
  // Added tokens by first byte, longest first, for the special-token split.
  std::array<std::vector<int32_t>, 256> added_by_first_byte;

  PreTokenizer pre;
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SentencePiece: prefix raw text with "▁"
  bool ignore_merges = false;     // byte-level: a word that is itself a token skips BPE (Llama 3)

  // Per-word cache for byte-level BPE (words repeat a lot); bounded, cleared when full.
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  bool in_range(int32_t id) const { return id >= 0 && id < size(); }
};

// What loaders hand to build_vocab: everything still as read from the file.
struct VocabSpec {
  Kind kind = Kind::byte_level_bpe;
  std::vector<std::string> tokens;
  std::vector<float> scores;                                // empty or [vocab]
  std::vector<TokenType> types;                             // empty or [vocab]
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<std::string> pre_patterns;
  int64_t bos = -1, eos = -1, unk = -1;
  std::vector<int64_t> extra_eog;  // eot/eom ids from the file
  bool add_bos = false, add_eos = false, add_space_prefix = false, ignore_merges = false;
};

// Validates the spec (ids in range, merges name known tokens) and builds the lookup tables.
Result<std::shared_ptr<const Vocab>> build_vocab(VocabSpec spec);

// BPE over one word. `word` is bytes (byte-level) or "▁"-escaped UTF-8 (SentencePiece).
void bpe_encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out);

}  // namespace troupe::tokenizer_detail
