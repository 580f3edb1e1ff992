// Block operations between the scheduler and the KV-block-manager actor (plan, then apply).
//
// The KV-block-manager actor is the only owner of block state. The scheduler core still
// decides a step synchronously, against a KvLedger: free-block and per-sequence block
// *counts* from the actor's last snapshot, plus prefix-cache hints for waiting sequences.
// The ledger records the core's calls as block operations (admit, reserve, free); the
// scheduler actor sends them in one KvOpsRequest per step, the actor applies them in order
// with apply_kv_ops() and answers with each operation's outcome, the block tables of the
// step's sequences and a fresh snapshot; Scheduler::settle() then fits the plan to what
// was applied. One round trip per step, whatever the number of sequences.
//
// The ledger's counts are exact or conservative, so what it accepts always fits: a
// reservation is charged what it adds; a freed sequence returns only the blocks it alone
// held; an admission is charged its new blocks plus the hinted cached blocks that sit in
// the free list -- or all its blocks, cached or not, once the same request frees a sequence
// (a hinted block shared at the snapshot may be in the free list by then). An admission's
// prefix hit is only a hint: the actor may find more or less cached (blocks evicted or
// cached by the same request's earlier operations), and then takes the largest hit that
// keeps the admission within the tokens and blocks the plan counted (with no hit at all a
// chunked admission always fits; a whole-prompt one may not, see apply_kv_ops).
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "runtime/sched/kv_block_manager.h"

namespace troupe {

struct KvOp {
  enum class Kind : uint8_t { Admit = 0, Reserve = 1, Free = 2, Truncate = 3 };
  Kind kind = Kind::Free;
  int64_t seq = 0;
  // Admit: the prompt tokens the plan takes from the prefix cache (the hint it used).
  int32_t cached = 0;
  // Admit: tokens the plan computes after them this step. Reserve: tokens to hold in all.
  // Truncate: tokens to keep.
  int32_t num_tokens = 0;
  // Admit: free blocks the plan counted for the admission (the most it may take).
  int32_t allowance = 0;
  // Admit: the step must reach the end of `tokens` (chunked prefill off).
  bool whole = false;
  std::vector<int32_t>
      tokens;  // Admit: the prompt; Reserve: the known tokens when the reservation fills a block (hashing)
};

struct KvOpResult {
  bool ok = false;
  int32_t cached = 0;   // Admit: tokens taken from the prefix cache
  int32_t num_new = 0;  // Admit: tokens to compute this step, from `cached` on
};

// A waiting sequence whose prefix-cache hit the next plan would like to know.
struct KvProbe {
  int64_t seq = 0;
  std::vector<int32_t> tokens;
};

struct KvHint {
  int64_t seq = 0;
  int32_t cached_blocks = 0;  // cached blocks add_sequence would reuse now
  int32_t free_listed = 0;    // how many of them sit in the free list (reusing one takes a free block)
};

struct KvTable {
  int64_t seq = 0;
  std::vector<int32_t> blocks;
};

// The block state as the scheduler's ledger needs it, after a request was applied.
struct KvSnapshot {
  int32_t num_free = 0;
  std::vector<KvSeqBlocks> seqs;  // every sequence the pool holds, by id
  std::vector<KvHint> hints;      // one per probe
  KvBlockStats stats;
};

struct KvOpsRequest {
  uint64_t batch = 0;
  std::vector<KvOp> ops;        // applied in order
  std::vector<KvProbe> probes;  // answered after the ops
  std::vector<int64_t> tables;  // sequences whose block tables the reply carries
  bool drop_cached = false;     // first: forget the free list's cached content (drop_cached_free)
};

struct KvOpsReply {
  uint64_t batch = 0;
  std::vector<KvOpResult> results;  // one per op
  std::vector<BlockCopy> copies;    // copy-on-write the step must perform first
  std::vector<KvTable> tables;      // one per requested sequence (empty if unknown)
  KvSnapshot snapshot;
};

// Applies a request to the block manager (what the KV-block-manager actor does with each
// message). Admissions go in order: once one is refused, the later ones are refused too
// (head-of-line, the order the policy chose).
KvOpsReply apply_kv_ops(KvBlockManager& kv, const KvOpsRequest& req);
KvSnapshot kv_snapshot(const KvBlockManager& kv, const std::vector<KvProbe>& probes);

// The scheduler side: block counts instead of blocks, calls recorded as operations.
class KvLedger : public KvBlocks {
 public:
  // chunked_prefill: as the scheduler's (an admission computing its whole prompt must then stay whole).
  KvLedger(const KvBlockConfig& cfg, bool chunked_prefill);

  const KvBlockConfig& config() const override { return cfg_; }
  std::optional<int32_t> add_sequence(int64_t seq, const std::vector<int32_t>& prompt) override;
  bool reserve(int64_t seq, int32_t num_tokens, const std::vector<int32_t>& tokens,
               std::vector<BlockCopy>* copies) override;
  void free_sequence(int64_t seq) override;
  // Returns the blocks past n tokens: counted free only as far as the sequence held them
  // alone (conservative; the next snapshot has the exact count).
  void truncate(int64_t seq, int32_t n) override;

  // Operations to send, or an admission that waits for a prefix-cache hint. Without a hint
  // an admission counts no cached tokens: fine when the whole prompt fits the step (the
  // actor then takes every cached block), but a first chunk would start at token 0, so a
  // sequence that may hit the cache (prefix caching on, more than one block of tokens) is
  // admitted in chunks only once a snapshot carries its hint (reserve refuses until then).
  bool has_pending() const { return !ops_.empty() || needs_probe_; }
  bool has_hint(int64_t seq) const { return hints_.count(seq) > 0; }
  bool may_hit(const std::vector<int32_t>& tokens) const {
    return cfg_.enable_prefix_caching && tokens.size() > static_cast<size_t>(cfg_.block_size);
  }
  // The operations recorded since the last call, in order.
  std::vector<KvOp> take_ops();
  // Replaces the counts and hints with the actor's (no operations may be pending).
  void sync(const KvSnapshot& s);
  int32_t num_free() const { return free_; }
  const KvBlockStats& stats() const { return stats_; }

 private:
  struct Held {
    int32_t held = 0, exclusive = 0;
  };
  int32_t blocks_needed(int32_t n) const { return blocks_for_tokens(n, cfg_.block_size); }

  KvBlockConfig cfg_;
  bool chunked_prefill_ = true;
  int32_t free_ = 0;
  bool needs_probe_ = false;
  bool freed_in_request_ = false;  // a Free is among the operations not yet sent
  std::map<int64_t, Held> held_;   // sequences the pool holds (as far as planned)
  struct Admission {
    int32_t cached_blocks = 0, free_listed = 0;  // from the hint
    bool hinted = false;
  };
  std::map<int64_t, Admission> admitting_;  // added this step, not yet reserved
  std::map<int64_t, KvHint> hints_;
  std::vector<KvOp> ops_;
  KvBlockStats stats_;
};

}  // namespace troupe
