// JSON mode (`response_format: {"type": "json_object"}`): the sampler only draws tokens that
// keep the output a prefix of one JSON object (RFC 8259), and the end of generation only
// once the object is closed; after it, nothing but the end.
//
// JsonPrefix reads bytes one at a time and says whether they can still continue an object
// text. Budgets keep the model from looping where JSON allows unbounded repetition:
// nesting at most kMaxDepth containers, at most kMaxSpaces whitespace bytes in a row, no
// whitespace before the opening brace. Strings take any byte >= 0x20 but '"' and '\'
// (escapes checked, \u with four hex digits, a surrogate only as a high-low pair, raw bytes
// only as well-formed UTF-8); numbers follow the grammar exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxSpaces = 16;
  // False (and the state unusable: feed a copy) when `c` cannot continue the text.
  bool feed(uint8_t c);
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!feed(static_cast<uint8_t>(c))) return false;
    return true;
  }
  bool complete() const { return st_ == St::Done; }
  // Inside a string with no escape or UTF-8 sequence pending: any whole UTF-8 text without
  // '"', '\' and controls continues it.
  bool in_plain_string() const { return st_ == St::Str && utf8_left_ == 0; }

 private:
  enum class St : uint8_t {
    Start,
    ObjKeyOrEnd,
    ObjKey,
    Colon,
    Value,
    ArrValueOrEnd,
    AfterValue,
    Str,
    StrEsc,
    StrHex,
    StrLowEsc,
    StrLowU,
    Num,
    Lit,
    Done
  };
  enum class Num : uint8_t { Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpInt };
  bool value_start(uint8_t c);
  bool after_value(uint8_t c);
  bool end_number_and(uint8_t c);
  bool utf8_lead(uint8_t c);

  St st_ = St::Start;
  Num num_ = Num::Minus;
  bool key_ = false;                         // the string being read is an object key
  uint8_t hex_left_ = 0;                     // \u digits still to come
  uint16_t hex_val_ = 0;                     // their value so far
  bool want_low_ = false;                    // a high surrogate was read: its low half must follow
  uint8_t utf8_left_ = 0;                    // continuation bytes still due in a string's UTF-8 sequence
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the range of the next one
  uint8_t lit_pos_ = 0;                      // bytes of true/false/null read
  const char* lit_ = nullptr;
  uint8_t spaces_ = 0;  // whitespace bytes in a row
  std::string stack_;   // '{' and '[' of the open containers
};

// Each token's bytes as the tokenizer decodes it, and which tokens end generation.
struct TokenBytes {
  std::vector<std::string> bytes;  // empty for control tokens
  std::vector<uint8_t> eog;        // 1: an end-of-generation token
  std::vector<uint8_t> plain;  // 1: non-empty whole UTF-8 without '"', '\' or bytes < 0x20 (continues any plain string)
  void finish();               // fills `plain` from `bytes`
};

class Tokenizer;
// Every token's bytes as they appear in decoded text (a leading space a tokenizer strips at
// the start of a text is kept), and its end-of-generation flag.
std::shared_ptr<const TokenBytes> token_bytes(const Tokenizer& tok);

// One request's constraint over its generated tokens.
class JsonConstraint {
 public:
  explicit JsonConstraint(std::shared_ptr<const TokenBytes> tokens) : tok_(std::move(tokens)) {}
  // Sets every token that cannot come next to -inf (end-of-generation tokens only once the
  // object is complete; if the model's vocabulary offers no way on, the end is allowed).
  void mask(float* logits, int32_t vocab) const;
  // The chosen token; false if it breaks the object (then the state stays as it was).
  bool accept(int32_t token);
  bool complete() const { return prefix_.complete(); }

 private:
  bool allowed(int32_t t) const;
  std::shared_ptr<const TokenBytes> tok_;
  JsonPrefix prefix_;
};

}  // namespace troupe
