// KV-block manager: fixed-size blocks of the paged KV cache with reference counts, a free
// list in LRU order, automatic prefix caching keyed by a chained hash of each full block's
// tokens (xxhash), fork with copy-on-write, truncation and counters. A plain class with no
// I/O: the scheduler, the simulator and the tests run the same code.
//
// Sequences are identified by the caller's ids. "No room" is a value (false / nullopt), never
// an exception: the scheduler then preempts.
#pragma once
#include <climits>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace troupe {

struct KvBlockConfig {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
};

// Whole blocks holding `tokens` tokens.
inline int32_t blocks_for_tokens(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

// The KV pool for a capacity in tokens, as `troupe serve --kv-cache-tokens` and `troupe sim`
// size it (whole blocks, rounded up).
inline KvBlockConfig kv_config_for_tokens(int64_t tokens, int32_t block_size, bool prefix_caching) {
  return {blocks_for_tokens(tokens, block_size), block_size, prefix_caching};
}

// A block copy the backend must perform before the next step (copy-on-write).
struct BlockCopy {
  int32_t src = -1, dst = -1;
};

struct KvBlockStats {
  int32_t num_blocks = 0, num_free = 0, num_cached_free = 0;
  uint64_t prefix_queries = 0;  // full blocks looked up
  uint64_t prefix_hits = 0;     // full blocks found in the cache
  double usage() const { return num_blocks ? 1.0 - static_cast<double>(num_free) / num_blocks : 0.0; }
};

// A sequence's share of the pool: blocks it holds, and how many of them it alone holds
// (freeing the sequence returns exactly those to the free list).
struct KvSeqBlocks {
  int64_t seq = 0;
  int32_t held = 0, exclusive = 0;
};

// What the scheduler core needs of the block state. The KV-block manager itself implements
// it (the engine, the simulator and the tests call it directly); the scheduler actor's
// KvLedger implements it over counts and records the calls as block operations for the
// KV-block-manager actor, the only owner of the blocks (runtime/sched/kv_ledger.h).
class KvBlocks {
 public:
  virtual ~KvBlocks() = default;
  virtual const KvBlockConfig& config() const = 0;
  // Starts a sequence; returns how many prompt tokens come from the prefix cache
  // (nullopt if the sequence exists).
  virtual std::optional<int32_t> add_sequence(int64_t seq, const std::vector<int32_t>& prompt) = 0;
  // Makes room for `num_tokens` tokens in total; false (nothing changed) when the pool is short.
  virtual bool reserve(int64_t seq, int32_t num_tokens, const std::vector<int32_t>& tokens,
                       std::vector<BlockCopy>* copies) = 0;
  virtual void free_sequence(int64_t seq) = 0;
  // Keeps the first n tokens' blocks (speculative rollback: drafts the target rejected).
  virtual void truncate(int64_t seq, int32_t n) = 0;
};

class KvBlockManager : public KvBlocks {
 public:
  explicit KvBlockManager(const KvBlockConfig& cfg);

  // Starts a sequence from a prompt: reuses cached blocks for the longest prefix of full
  // blocks already in the cache and returns how many prompt tokens they cover. At least
  // one token is always left to compute. nullopt if the sequence exists.
  std::optional<int32_t> add_sequence(int64_t seq, const std::vector<int32_t>& prompt) override {
    return add_sequence(seq, prompt, INT32_MAX);
  }
  // The same, reusing at most `max_cached_blocks` cached blocks.
  std::optional<int32_t> add_sequence(int64_t seq, const std::vector<int32_t>& prompt, int32_t max_cached_blocks);
  // The cached blocks add_sequence would reuse for this prompt, changing nothing (no
  // counters either): one entry per block, true where the block sits in the free list
  // (reusing it takes it from there) and false where running sequences already share it.
  std::vector<bool> probe_prefix(const std::vector<int32_t>& prompt) const;
  // Makes room for the sequence to hold `num_tokens` tokens in total (the first
  // `tokens.size()` of which are known, for hashing blocks as they fill). False when not
  // enough blocks are free; nothing changes then.
  bool reserve(int64_t seq, int32_t num_tokens, const std::vector<int32_t>& tokens,
               std::vector<BlockCopy>* copies) override;
  // Records that the first `tokens.size()` tokens are now computed (full blocks get hashed
  // and become shareable).
  void commit(int64_t seq, const std::vector<int32_t>& tokens);
  // Releases every block of the sequence (cached blocks stay reusable until evicted).
  void free_sequence(int64_t seq) override;
  // The child shares all of the parent's blocks; the first write into a shared block copies it.
  bool fork(int64_t parent, int64_t child);
  // Keeps the first n tokens (speculative rollback); frees blocks past them.
  void truncate(int64_t seq, int32_t n) override;
  // Forgets the content of every cached block in the free list (a stage's KV was lost: a
  // stage node restarted); blocks held by sequences keep theirs. Returns how many.
  int32_t drop_cached_free();

  const std::vector<int32_t>* block_table(int64_t seq) const;
  int32_t num_tokens(int64_t seq) const;
  int32_t blocks_needed(int32_t num_tokens) const { return blocks_for_tokens(num_tokens, cfg_.block_size); }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_.size()); }
  KvBlockStats stats() const;
  // Lookups made outside add_sequence (an admission that probed first): counted as queries.
  void count_prefix_queries(uint64_t n) { queries_ += n; }
  // Every sequence's share of the pool, by id.
  std::vector<KvSeqBlocks> seq_blocks() const;
  const KvBlockConfig& config() const override { return cfg_; }

  // Checks every structural invariant; the error names the first one broken.
  Status check_invariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    uint64_t hash = 0;
    bool has_hash = false;
    std::list<int32_t>::iterator free_pos;
    bool in_free = false;
  };
  struct Seq {
    std::vector<int32_t> blocks;
    int32_t num_tokens = 0;        // tokens the blocks are reserved for
    std::vector<uint64_t> hashes;  // chained hashes of the leading full blocks
  };
  int32_t take_free_block();  // from the LRU head; evicts its cached hash
  void release(int32_t b);    // ref--, to the LRU tail when unused
  uint64_t chain_hash(uint64_t parent, const int32_t* tokens) const;

  KvBlockConfig cfg_;
  std::vector<Block> blocks_;
  std::list<int32_t> free_;  // LRU: front is evicted first
  std::unordered_map<uint64_t, int32_t> cached_;
  std::unordered_map<int64_t, Seq> seqs_;
  int32_t cached_free_ = 0;  // free-list blocks with cached content (kept, not counted per call)
  uint64_t queries_ = 0, hits_ = 0;
};

}  // namespace troupe
