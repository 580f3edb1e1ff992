// The scheduler core: continuous batching under one token budget per step.
//
// One rule (as in vLLM v1): every step, each running request gets
// min(tokens it still has to compute, budget left) tokens, in policy order; waiting
// requests are admitted after the running ones while budget and the running cap allow.
// Prefill, chunked prefill, decode and prefix-cache hits all fall out of that rule. When the
// KV pool is full the policy's victim is preempted by recompute and later resumes. Under an
// inter-token latency target the budget shrinks while requests stream (itl_target_s).
// A plain class: deterministic for the same inputs (step times come in through
// observe_step), no clocks, no I/O.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "common/result.h"
#include "runtime/sched/kv_block_manager.h"
#include "runtime/request/seq_request.h"
#include "runtime/sched/kv_ledger.h"
#include "runtime/sched/step_time.h"

namespace troupe {

struct SchedulerConfig {
  int32_t max_batched_tokens = 2048;  // token budget per step
  int32_t max_running = 128;          // cap on running sequences
  // false: a prompt is computed in one step or waits (vLLM without chunked prefill); prompts
  // longer than the budget are refused at admission. A preempted sequence whose tokens
  // outgrew the budget is still resumed in chunks, so it cannot starve.
  bool chunked_prefill = true;
  // Inter-token latency target, seconds (0: off; needs chunked prefill). While any running
  // sequence has sampled a token, a step's tokens are capped so that its predicted time
  // (StepTimeModel, fed by observe_step) stays within max(target, three times a step of the
  // decoding sequences alone): prefill goes on in smaller chunks beside the decodes instead
  // of stalling them, and always gets at least two thirds of such a step.
  double itl_target_s = 0;
};

// Per-request state the policies look at.
struct SchedState {
  SeqRequest req;
  uint64_t arrival = 0;         // admission order, for FCFS ties
  std::vector<int32_t> tokens;  // prompt + generated so far
  int32_t num_computed = 0;     // tokens whose KV is in the cache
  int32_t num_generated = 0;
  int32_t num_preemptions = 0;
  int64_t queue_rank = 0;  // tie-break in the waiting queue (the order a stable sort keeps)
};

// Policies are strategy objects: `before(a, b)` orders queues and running requests; the
// last running request in that order is the preemption victim. `before` may read only what
// does not change while a request waits (req, arrival): the waiting queue is an ordered set.
struct SchedulingPolicy {
  std::function<bool(const SchedState&, const SchedState&)> before;
  static SchedulingPolicy fcfs();
  static SchedulingPolicy priority();
};

struct ScheduledSeq {
  int64_t id = 0;
  int32_t num_computed = 0;  // tokens already in the cache before this step
  int32_t num_new = 0;       // tokens computed this step
  bool samples = false;      // the step reaches the end of the known tokens: sample one
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<int64_t> preempted;
  std::vector<BlockCopy> copies;
  int32_t num_tokens = 0;
};

struct FinishedRequest {
  int64_t id = 0;
  std::vector<int32_t> output;
  bool hit_stop = false;  // stop token (else length)
};

class Scheduler;
// Orders the waiting queue: the policy, then queue_rank among requests the policy ties (so
// the set keeps exactly the order a stable sort of the queue would).
struct WaitingOrder {
  const Scheduler* sched = nullptr;
  bool operator()(int64_t a, int64_t b) const;
};
using WaitingQueue = std::set<int64_t, WaitingOrder>;

class Scheduler {
 public:
  // kv: the block manager itself, or a KvLedger whose operations the caller applies at
  // the KV-block-manager actor and then passes to settle().
  Scheduler(const SchedulerConfig& cfg, KvBlocks& kv, SchedulingPolicy policy);
  Scheduler(const Scheduler&) = delete;  // (the waiting queue's order points at this object)
  Scheduler& operator=(const Scheduler&) = delete;
  // Refuses (error) a request that could never fit the pool even alone, or a duplicate id.
  Status add(SeqRequest r);
  // Drops a request wherever it is; its blocks return to the pool at once.
  void abort(int64_t id);
  // `busy`: sequences inside plans still in flight (a pipeline with several plans in
  // flight); they are neither scheduled nor chosen as preemption victims.
  StepPlan schedule(const std::set<int64_t>* busy = nullptr);
  // Fits a plan made against a KvLedger to what the KV-block-manager actor applied (`ops`
  // as the ledger recorded them, `results` one per op): an admission computes from the
  // prefix hit the actor found, a refused one goes back to the head of the queue. Error:
  // results that do not match the plan, or a refusal the ledger's counts rule out (a
  // reservation, or a chunked admission not behind an earlier refused one).
  Status settle(StepPlan& plan, const std::vector<KvOp>& ops, const std::vector<KvOpResult>& results);
  // Applies one sampled token per `samples` entry of the plan, in plan order;
  // is_stop(id, token) says whether a token ends its request.
  std::vector<FinishedRequest> update(const StepPlan& plan, const std::vector<int32_t>& sampled,
                                      const std::function<bool(int64_t, int32_t)>& is_stop);
  size_t num_waiting() const { return waiting_.size(); }
  const WaitingQueue& waiting() const { return waiting_; }  // in policy order
  size_t num_running() const { return running_.size(); }
  const SchedState* state(int64_t id) const;
  uint64_t num_preemptions() const { return preemptions_; }
  // A step planned as `plan` took `seconds` (wall time in serving, the cost model's in the
  // simulator); teaches the step-time model behind the latency target.
  void observe_step(const StepPlan& plan, double seconds);
  const StepTimeModel& step_time() const { return step_time_; }
  // Plans whose token budget the latency target lowered.
  uint64_t num_capped_steps() const { return capped_steps_; }

 private:
  friend struct WaitingOrder;
  // Into the waiting queue at the back (a new request) or the front (a preempted or refused
  // one) of the requests the policy ties it with: O(log n), never a sort of the queue.
  void enqueue(int64_t id, bool front);
  void preempt(int64_t id);
  bool may_split(int32_t left, int32_t n) const;
  int32_t step_budget(const std::set<int64_t>* busy) const;

  SchedulerConfig cfg_;
  KvBlocks& kv_;
  SchedulingPolicy policy_;
  std::map<int64_t, SchedState> states_;
  WaitingQueue waiting_;
  std::vector<int64_t> running_;
  uint64_t next_arrival_ = 0;
  int64_t back_rank_ = 0, front_rank_ = 0;
  uint64_t preemptions_ = 0;
  StepTimeModel step_time_;
  uint64_t capped_steps_ = 0;
};

}  // namespace troupe
