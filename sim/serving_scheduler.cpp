#include "sim/serving_scheduler.h"

#include "runtime/sched/kv_round.h"

namespace troupe::sim {

ServingScheduler::ServingScheduler(const SchedulerConfig& sc, const KvBlockConfig& kc, SchedulingPolicy policy)
    : kv_(kc), ledger_(kc, sc.chunked_prefill), sched_(sc, ledger_, std::move(policy)) {}

Status ServingScheduler::round(StepPlan& plan) {
  KvOpsRequest req = make_kv_request(ledger_, sched_, plan, ++batch_);
  const KvOpsReply reply = apply_kv_ops(kv_, req);
  TROUPE_TRY(finish_kv_round(ledger_, sched_, plan, req.ops, reply));
  if (!reply.copies.empty()) return make_error("a step plan asked for block copies");
  return {};
}

Result<StepPlan> ServingScheduler::plan() {
  // (Two rounds without a plan in a row: nothing more would change.)
  for (int idle = 0;; ++idle) {
    StepPlan p = sched_.schedule();
    if (p.seqs.empty() && (idle >= 2 || !(ledger_.has_pending() || kv_hints_missing(ledger_, sched_)))) return p;
    TROUPE_TRY(round(p));
    if (!p.seqs.empty()) return p;
  }
}

Status ServingScheduler::fetch_hints() {
  if (!kv_hints_missing(ledger_, sched_)) return {};
  StepPlan none;
  return round(none);
}

}  // namespace troupe::sim
