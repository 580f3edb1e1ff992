// Grammars for structured output: a GBNF text (llama.cpp's grammar format: `name ::= ...`
// rules of "literals", [character classes], `.`, rule references, ( groups ), `|`, and the
// repetitions * + ? {m} {m,} {m,n}) compiled to byte-level rules, and the set of parse
// stacks that says which bytes may come next. Everything the server constrains -- JSON
// schemas, regexes, choices (runtime/grammar/json_schema.h) and grammars given as text --
// becomes one GBNF text, which is what travels in SamplingParams::grammar and what is
// compiled (once per text: runtime/sample/grammar_constraint.h caches it with its masks).
//
// Byte level: a character class is compiled to the UTF-8 byte sequences of its code points
// (surrogates excluded), so a token that ends inside a multi-byte character is matched as
// far as it goes. Repetitions become right-recursive rules with tail calls (a reference
// that ends its alternative pushes no return position), so `x*` over any length keeps the
// stacks the same size and the same state repeats -- which is what makes the per-state mask
// cache hit. Left recursion (a rule reaching itself before any byte) is refused at compile
// time, which also refuses a repetition of something that can match nothing.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace troupe {

struct GrammarLimits {
  size_t max_source_bytes = 1u << 20;  // the GBNF text
  size_t max_elements = 200000;        // compiled elements, repetitions expanded
  int32_t max_repeat = 4096;           // m and n of {m,n}
};

class Grammar {
 public:
  enum class Op : uint8_t { Bytes, Ref, End };
  struct Elem {
    Op op = Op::End;
    uint32_t arg = 0;  // Bytes: a byte set; Ref: a rule
  };
  using ByteSet = std::array<uint64_t, 4>;

  // Parses and checks (every referenced rule defined, a `root` rule, no left recursion,
  // the limits); the error says what and where (the rule's name, or the text's offset).
  static Result<std::shared_ptr<const Grammar>> compile(std::string_view gbnf, const GrammarLimits& lim = {});

  const std::vector<Elem>& code() const { return code_; }
  // Start positions in code() of a rule's alternatives (each ends with an End element).
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rule_alts_[rule]; }
  bool has_byte(uint32_t set, uint8_t b) const { return (sets_[set][b >> 6] >> (b & 63)) & 1u; }
  uint32_t root() const { return root_; }
  size_t num_rules() const { return rule_alts_.size(); }

 private:
  friend class GrammarBuilder;
  std::vector<Elem> code_;
  std::vector<std::vector<uint32_t>> rule_alts_;
  std::vector<ByteSet> sets_;
  uint32_t root_ = 0;
};

// Where a parse can be: a set of stacks of positions in Grammar::code() (the back of a
// stack is the byte set to match next, the rest are return positions); an empty stack has
// matched the whole root rule. Kept sorted and unique, so equal states have equal keys.
class GrammarState {
 public:
  static constexpr size_t kMaxStackDepth = 256;  // deeper parses are dropped
  static constexpr size_t kMaxStacks = 1024;     // more ambiguity than this is cut (overflowed())
  static constexpr size_t kMaxWork = 200000;     // expansion steps per byte, then cut (overflowed())

  explicit GrammarState(const Grammar& g);  // the start: root's alternatives, expanded
  // Advances over one byte; false when no stack can take it (the state is then empty).
  bool feed(uint8_t b);
  // The state after byte b, this one unchanged (dead() when no stack takes it).
  GrammarState after(uint8_t b) const;
  bool feed(std::string_view bytes) {
    for (char c : bytes)
      if (!feed(static_cast<uint8_t>(c))) return false;
    return true;
  }
  bool accepting() const { return !stacks_.empty() && stacks_.front().empty(); }  // sorted: empty first
  bool can_continue() const { return !stacks_.empty() && !stacks_.back().empty(); }
  // Whether some stack can take byte b (no new state built).
  bool takes(uint8_t b) const;
  bool dead() const { return stacks_.empty(); }
  bool overflowed() const { return overflowed_; }
  size_t num_stacks() const { return stacks_.size(); }
  // Canonical text of the stack set: equal for equal states.
  std::string key() const;

 private:
  GrammarState() = default;
  void advance(uint8_t b, GrammarState& out) const;
  void expand(std::vector<uint32_t>& s, std::vector<std::vector<uint32_t>>& out);
  void normalise(std::vector<std::vector<uint32_t>>& v);
  const Grammar* g_ = nullptr;
  std::vector<std::vector<uint32_t>> stacks_;
  bool overflowed_ = false;
  size_t work_ = 0;  // expansion steps of the current byte
};

// Code point ranges [lo, hi] as the UTF-8 byte-range sequences that encode exactly them
// (surrogates D800-DFFF excluded): each inner vector is one sequence of [lo, hi] byte ranges.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi);

}  // namespace troupe
