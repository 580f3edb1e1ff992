// KV-block-manager actor: the only owner of the paged KV cache's block state (runtime/
// kv_block_manager.h). The scheduler actor plans each step against a ledger of block counts
// and sends the step's block operations here in one KvOpsRequest; this actor applies them in
// order (runtime/sched/kv_ledger.h apply_kv_ops) and answers with each operation's outcome, the
// block tables of the step's sequences and a fresh snapshot (free blocks, per-sequence
// counts, prefix-cache hints and counters).
#pragma once
#include <memory>

#include "actors/messages.h"
#include "runtime/sched/kv_block_manager.h"

namespace troupe::actors {

struct KvBlockActorConfig {
  KvBlockConfig kv;
  // Checks every invariant of the block manager after each request (tests); a broken one
  // is answered as an error, which fails the engine instead of corrupting the cache.
  bool check_invariants = false;
};

struct KvBlockState {
  std::unique_ptr<KvBlockManager> kv;
  bool check = false;
  static inline const char* name = "kv-block-manager";
};

kv_block_actor::behavior_type kv_block_fn(kv_block_actor::stateful_pointer<KvBlockState> self, KvBlockActorConfig cfg);

}  // namespace troupe::actors
