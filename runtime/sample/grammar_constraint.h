// Structured output in the sampler: a request's grammar (SamplingParams::grammar, GBNF
// text; runtime/grammar/) as a token mask per step.
//
// Cost per token: the mask of a parse state is computed once -- a walk of the vocabulary's
// byte trie that advances the state byte by byte and drops a whole subtree as soon as no
// stack survives its prefix -- and kept in the grammar's table under the state's key, so a
// state seen again (every character inside a string, every digit of a number, the same
// key of the next request with the same schema) costs a lookup and a pass that applies the
// bit mask. The table belongs to a GrammarCache (one per last pipeline stage, keyed by the
// grammar text), so every request with the same schema shares it.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "runtime/grammar/grammar.h"
#include "runtime/sample/json_constraint.h"  // TokenBytes

namespace troupe {

// The vocabulary's bytes as a trie (tokens with equal bytes share a node).
struct TokenTrie {
  struct Node {
    uint32_t first_child = 0;  // 0: none (node 0 is the root, never a child)
    uint32_t next_sibling = 0;
    uint8_t byte = 0;
    uint32_t tokens_begin = 0, tokens_end = 0;  // into `tokens`: the tokens ending here
  };
  std::vector<Node> nodes;
  std::vector<int32_t> tokens;
  explicit TokenTrie(const TokenBytes& tb);
};

// One grammar over one vocabulary, with its per-state masks.
class GrammarTable {
 public:
  // Then the table starts over: with the cache's 32 grammars, at most 32 x 1024 masks of
  // vocab/8 bytes (6 KiB for a 49k vocabulary): about 200 MiB in the worst case.
  static constexpr size_t kMaxMasks = 1024;
  struct Mask {
    std::vector<uint64_t> allowed;  // bit per token (end-of-generation tokens: `accepting`)
    bool accepting = false;         // the output may end here
    bool any = false;               // some non-end token is allowed
  };
  GrammarTable(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenBytes> tb,
               std::shared_ptr<const TokenTrie> trie)
      : g_(std::move(g)), tb_(std::move(tb)), trie_(std::move(trie)) {}
  const Grammar& grammar() const { return *g_; }
  const TokenBytes& tokens() const { return *tb_; }
  // The state's mask, from the table or computed (then kept).
  std::shared_ptr<const Mask> mask(const GrammarState& st);
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  std::shared_ptr<const Mask> compute(const GrammarState& st) const;
  void walk(uint32_t node, const GrammarState& st, Mask& m) const;
  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const TokenBytes> tb_;
  std::shared_ptr<const TokenTrie> trie_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Mask>> masks_;
  uint64_t hits_ = 0, misses_ = 0;
};

// Compiled grammars by text, least recently used dropped past `capacity`.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenBytes> tb, size_t capacity = 32);
  Result<std::shared_ptr<GrammarTable>> get(const std::string& gbnf);
  size_t size() const { return lru_.size(); }

 private:
  std::shared_ptr<const TokenBytes> tb_;
  std::shared_ptr<const TokenTrie> trie_;
  size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<GrammarTable>>> lru_;  // most recent first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

// One request's constraint over its generated tokens (the grammar-mode twin of JsonConstraint).
class GrammarConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<GrammarTable> table)
      : table_(std::move(table)), state_(table_->grammar()) {}
  // Sets every token that cannot come next to -inf (end-of-generation tokens unless the
  // grammar can end here; if no token can go on, the end is allowed).
  void mask(float* logits, int32_t vocab) const;
  // The chosen token; false if the grammar does not allow it (the state stays as it was).
  bool accept(int32_t token);
  bool accepting() const { return state_.accepting(); }

 private:
  std::shared_ptr<GrammarTable> table_;
  GrammarState state_;
};

}  // namespace troupe
