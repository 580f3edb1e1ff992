// Tokenizer: text <-> token ids for the two vocabulary kinds GGUF models use.
//
//  - Byte-level BPE (tokenizer.ggml.model "gpt2"; GPT-2, Llama 3, Qwen2, SmolLM): the text is cut
//    into words by the pre-tokenizer regexes of tokenizer.ggml.pre (PCRE2, Unicode properties),
//    each word's bytes are spelled with GPT-2's bytes-to-unicode alphabet, and merges are applied
//    lowest rank first.
//  - SentencePiece-style BPE (tokenizer.ggml.model "llama"; Llama 2): spaces become U+2581 "▁",
//    an optional "▁" prefix is added, adjacent pieces merge highest score first, and characters
//    that are not in the vocabulary fall back to <0xXX> byte tokens.
//
// Added tokens (GGUF token_type CONTROL=3 or USER_DEFINED=4; "added_tokens" in tokenizer.json)
// are cut out of the text before the pre-tokenizer. As in llama.cpp, USER_DEFINED tokens are
// always matched; CONTROL tokens only when `parse_special` is true.
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); encode/decode are
// safe to call from several threads. Every index read from a file is range-checked; a bad file
// yields an error, and bad ids passed to decode are skipped.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "runtime/format/gguf.h"

namespace troupe {

namespace tokenizer_detail {
struct Vocab;  // defined in runtime/tokenizer/tokenizer_internal.h
}

class Tokenizer {
 public:
  static Result<Tokenizer> from_gguf(const gguf::File& f);
  // HF directory with tokenizer.json (+ optional tokenizer_config.json for bos/eos/add_bos).
  static Result<Tokenizer> from_hf_dir(const std::string& dir);

  // parse_special: when true, text matching CONTROL tokens (e.g. "<|im_start|>") maps to that
  // token id; when false such text is tokenized as plain text. add_special: prepend BOS (and
  // append EOS) when the model asks for it. Invalid UTF-8 in `text` is replaced by U+FFFD.
  // Byte-level vocabularies that lack a byte's character drop that byte (as HF and llama.cpp do).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // Out-of-range ids are skipped. skip_special drops CONTROL tokens (BOS, EOS, <|im_end|>...).
  // Bytes that do not form valid UTF-8 come back as U+FFFD (token_text gives the raw bytes).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Raw bytes of one token (byte-level / ▁ / <0xXX> decoded); "" for an out-of-range id.
  std::string token_text(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;             // -1 if none
  int32_t eos_id() const;             // -1 if none
  bool is_eog(int32_t id) const;      // eos, eot, <|im_end|>, <|eot_id|>, <|end_of_text|>...
  bool is_special(int32_t id) const;  // CONTROL tokens
  bool add_bos() const;
  bool add_eos() const;
  // Finds the id of a token by its stored spelling (byte-level alphabet / ▁); -1 if absent.
  int32_t find_token(std::string_view stored_text) const;
  // True when decode drops one leading space of the first token (SentencePiece add_space_prefix).
  bool strips_leading_space() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::Vocab> v) : v_(std::move(v)) {}
  std::shared_ptr<const tokenizer_detail::Vocab> v_;
};

// Incremental detokenizer: feed token ids one at a time, get back only complete UTF-8 text
// (never a split multibyte sequence); flush() returns anything left (invalid bytes as U+FFFD).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special = true);
  std::string push(int32_t id);
  std::string flush();

 private:
  Tokenizer tok_;  // shares the vocabulary; cheap to copy
  bool skip_special_;
  bool is_first_ = true;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

bool is_valid_utf8(std::string_view s);
// Replaces every invalid UTF-8 sequence with U+FFFD (maximal subparts, like Python/WHATWG).
std::string sanitize_utf8(std::string_view s);

}  // namespace troupe
