// One KV round trip on the scheduler's side: what `troupe serve`'s scheduler actor sends
// the KV-block-manager actor each step, and how the answer comes back into the ledger and
// the plan. sim/ runs the same functions, applying the request in line (apply_kv_ops), so
// the simulator plans through the serving path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/result.h"
#include "runtime/sched/kv_ledger.h"
#include "runtime/sched/scheduler.h"

namespace troupe {

// The waiting sequences whose prefix-cache hints a request asks for: the first
// kMaxKvProbes at the head of the queue (where admissions come from) that could hit.
constexpr size_t kMaxKvProbes = 8;
std::vector<int64_t> kv_probe_window(const KvLedger& ledger, const Scheduler& sched);
// A sequence in the probe window has no hint yet (worth a request even with no plan).
bool kv_hints_missing(const KvLedger& ledger, const Scheduler& sched);
// One step's request: the operations the ledger recorded (taken from it), the plan's
// sequences for block tables, and the probe window.
KvOpsRequest make_kv_request(KvLedger& ledger, const Scheduler& sched, const StepPlan& plan, uint64_t batch);
// The operations as settle() reads them, without their token lists (kept while a request is out).
std::vector<KvOp> kv_ops_for_settle(const std::vector<KvOp>& ops);
// The answer: the ledger takes the snapshot, and a plan with operations is fitted to
// what was applied (Scheduler::settle).
Status finish_kv_round(KvLedger& ledger, Scheduler& sched, StepPlan& plan, const std::vector<KvOp>& ops,
                       const KvOpsReply& reply);

}  // namespace troupe
