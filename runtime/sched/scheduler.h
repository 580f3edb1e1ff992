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
#include "runtime/spec/draft_source.h"

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
  // Speculative decoding: the most draft tokens one decoding sequence feeds in a step (0:
  // off; drafts come from the source set with set_draft_source). Drafts take only the
  // budget and free blocks the step leaves after every running sequence and admission, so
  // they never preempt, delay a prefill or cut a decode; how many a sequence gets follows
  // its acceptance so far and the step-time model (plan_drafts in scheduler.cpp).
  int32_t num_speculative_tokens = 0;
};

// Speculative decoding counters (vLLM's spec_decode metrics).
struct SpecStats {
  uint64_t num_drafts = 0;                 // sequence steps that fed drafts
  uint64_t num_draft_tokens = 0;           // draft tokens fed
  uint64_t num_accepted_tokens = 0;        // drafts the target's own tokens matched
  std::vector<uint64_t> accepted_per_pos;  // [i]: drafts at position i (0-based) accepted
};

// Per-request state the policies look at.
struct SchedState {
  SeqRequest req;
  uint64_t arrival = 0;         // admission order, for FCFS ties
  std::vector<int32_t> tokens;  // prompt + generated so far
  int32_t num_computed = 0;     // tokens whose KV is in the cache
  int32_t num_generated = 0;
  int32_t num_preemptions = 0;
  int64_t queue_rank = 0;             // tie-break in the waiting queue (the order a stable sort keeps)
  int64_t drafted = 0, accepted = 0;  // speculative drafts fed for it and accepted so far
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
  // Speculative drafts fed after the last known token (counted in num_new): the step has a
  // logit row for that token and for each draft, and the target's tokens verify them.
  std::vector<int32_t> drafts;
  int32_t logit_rows() const { return samples ? 1 + static_cast<int32_t>(drafts.size()) : 0; }
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
  // Tokens of the finishing step it kept: with drafts, the run can end inside the step
  // (at a stop token or the length), and the step's later tokens are dropped.
  int32_t step_tokens = 1;
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
  // Applies the sampled tokens of each `samples` entry of the plan, in plan order: one per
  // entry, or `counts[i]` for the i-th sampling entry (1 + the drafts the target's tokens
  // accepted, for one with drafts); is_stop(id, token) says whether a token ends its
  // request. Rejected drafts' blocks go back (KvBlocks::truncate); a token that does not
  // match the draft it follows ends the accepted run there whatever `counts` says.
  std::vector<FinishedRequest> update(const StepPlan& plan, const std::vector<int32_t>& sampled,
                                      const std::function<bool(int64_t, int32_t)>& is_stop,
                                      const std::vector<int32_t>* counts = nullptr);
  // Where drafts come from (null: none); not owned. Told when a sequence goes.
  void set_draft_source(DraftSource* d) { draft_ = d; }
  const SpecStats& spec_stats() const { return spec_; }
  size_t num_waiting() const { return waiting_.size(); }
  const WaitingQueue& waiting() const { return waiting_; }  // in policy order
  size_t num_running() const { return running_.size(); }
  const SchedState* state(int64_t id) const;
  uint64_t num_preemptions() const { return preemptions_; }
  // A step planned as `plan` took `seconds` (wall time in serving, the cost model's in the
  // simulator); teaches the step-time model behind the latency target. draft_seconds: the
  // part of it the worker spent in self-draft rounds (SelfDraft), learned apart as the
  // price of a round, so the step-time model prices the step's own pass.
  void observe_step(const StepPlan& plan, double seconds, double draft_seconds = 0);
  double draft_round_seconds() const { return round_seconds_; }  // (0: none measured yet)
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
  int32_t plan_drafts(StepPlan& plan, int32_t budget, const std::set<int64_t>& admitted);
  static constexpr double kPriorAccepted = 4, kPriorDrafted = 5;  // plan_drafts' prior acceptance
  static constexpr int kExploreEvery = 64;  // plans without drafts before one feeds a draft anyway

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
  DraftSource* draft_ = nullptr;
  int plans_without_drafts_ = 0;
  double round_seconds_ = 0;  // a self-draft round, measured (decayed mean)
  SpecStats spec_;
};

}  // namespace troupe
