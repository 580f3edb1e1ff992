// The scheduler as `troupe serve`'s scheduler actor runs it: it plans against a KvLedger,
// and each step's block operations go to the block manager in one request (applied in
// line here, where serve sends it to the KV-block-manager actor) and are settled back
// into the plan (runtime/sched/kv_round.h). The simulator plans through this, so its
// decisions are the serving path's.
#pragma once
#include <cstdint>

#include "common/result.h"
#include "runtime/sched/kv_block_manager.h"
#include "runtime/sched/kv_ledger.h"
#include "runtime/sched/scheduler.h"

namespace troupe::sim {

class ServingScheduler {
 public:
  ServingScheduler(const SchedulerConfig& sc, const KvBlockConfig& kc, SchedulingPolicy policy);
  ServingScheduler(const ServingScheduler&) = delete;
  ServingScheduler& operator=(const ServingScheduler&) = delete;

  Scheduler& sched() { return sched_; }
  const Scheduler& sched() const { return sched_; }
  const KvBlockManager& kv() const { return kv_; }
  size_t load() const { return sched_.num_running() + sched_.num_waiting(); }

  // The next step's plan, after the KV rounds serve makes for it (a plan's own round, and
  // rounds that only free blocks or fetch prefix-cache hints); empty: nothing fits now.
  Result<StepPlan> plan();
  // While a step runs, serve fetches the hints of sequences that arrived meanwhile, so the
  // next plan can admit them at once.
  Status fetch_hints();

 private:
  Status round(StepPlan& plan);

  KvBlockManager kv_;  // what the KV-block-manager actor owns
  KvLedger ledger_;
  Scheduler sched_;
  uint64_t batch_ = 0;
};

}  // namespace troupe::sim
