#include "runtime/sched/kv_round.h"

namespace troupe {

std::vector<int64_t> kv_probe_window(const KvLedger& ledger, const Scheduler& sched) {
  std::vector<int64_t> ids;
  for (int64_t id : sched.waiting()) {
    if (ids.size() == kMaxKvProbes) break;
    const SchedState* s = sched.state(id);
    if (s && ledger.may_hit(s->tokens)) ids.push_back(id);
  }
  return ids;
}

bool kv_hints_missing(const KvLedger& ledger, const Scheduler& sched) {
  for (int64_t id : kv_probe_window(ledger, sched))
    if (!ledger.has_hint(id)) return true;
  return false;
}

KvOpsRequest make_kv_request(KvLedger& ledger, const Scheduler& sched, const StepPlan& plan, uint64_t batch) {
  KvOpsRequest req;
  req.batch = batch;
  req.ops = ledger.take_ops();
  for (const auto& q : plan.seqs) req.tables.push_back(q.id);
  for (int64_t id : kv_probe_window(ledger, sched)) req.probes.push_back({id, sched.state(id)->tokens});
  return req;
}

std::vector<KvOp> kv_ops_for_settle(const std::vector<KvOp>& ops) {
  std::vector<KvOp> out;
  out.reserve(ops.size());
  for (const KvOp& op : ops) {
    KvOp light;
    light.kind = op.kind;
    light.seq = op.seq;
    light.cached = op.cached;
    light.num_tokens = op.num_tokens;
    light.allowance = op.allowance;
    light.whole = op.whole;
    out.push_back(std::move(light));
  }
  return out;
}

Status finish_kv_round(KvLedger& ledger, Scheduler& sched, StepPlan& plan, const std::vector<KvOp>& ops,
                       const KvOpsReply& reply) {
  ledger.sync(reply.snapshot);
  if (!ops.empty() && !plan.seqs.empty()) TROUPE_TRY(sched.settle(plan, ops, reply.results));
  return {};
}

}  // namespace troupe
