// Scheduler actor: wraps the scheduler core (runtime/sched/scheduler.h). It admits sequences from
// request actors, plans one step at a time (continuous batching: decodes and prefill chunks
// share the token budget), has the KV-block-manager actor apply the step's block operations,
// sends the plan to the first pipeline stage, and on the step's result applies the sampled
// tokens, streams them to each sequence's request actor and plans the next step. Cancelled
// sequences free their KV blocks at once.
//
// The block state belongs to the KV-block-manager actor. The core plans against a KvLedger
// (block counts from the actor's last snapshot); the ledger's recorded operations go to the
// actor in one request per step, awaited (no other message is handled meanwhile, so the
// ledger and the actor never disagree about what was applied), and Scheduler::settle() fits
// the plan to the answer (runtime/sched/kv_ledger.h, docs/serving.md).
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "actors/messages.h"
#include "runtime/engine/engine.h"
#include "runtime/sched/kv_block_manager.h"
#include "runtime/sched/kv_ledger.h"
#include "runtime/sched/scheduler.h"

namespace troupe::actors {

struct SchedulerActorConfig {
  SchedulerConfig scheduler;
  KvBlockConfig kv;
  SchedulingPolicy policy = SchedulingPolicy::fcfs();
  int32_t vocab_size = 0;
  int32_t max_context = 0;
  std::function<bool(int32_t)> is_eog;        // the model's end-of-generation tokens
  std::chrono::milliseconds heartbeat{1000};  // 0: no heartbeat (tests)
  // Step plans in flight at once (each over sequences no other in-flight plan holds): with N
  // pipeline stages, N plans keep every stage busy. 0: one per pipeline stage.
  int32_t max_plans_in_flight = 0;
  // Called on the scheduler's thread for every finished step with its plan, the seconds
  // from sending it to its result and the workers' compute seconds (`troupe serve
  // --step-log`: what `troupe sim calibrate --steps` fits and `sim validate` compares).
  std::function<void(const StepPlan&, double seconds, double compute_seconds)> on_step;
  // Speculative decoding (`troupe serve --speculative`; scheduler.num_speculative_tokens
  // drafts at most): proposes each decoding sequence's drafts as the step is planned.
  std::shared_ptr<DraftSource> draft;
};

// The latest engine stats, published by the scheduler actor after every step and heartbeat
// so that the HTTP threads read health and metrics without a message round trip.
class StatsBoard {
 public:
  void publish(const EngineStats& s) {
    std::lock_guard<std::mutex> l(mu_);
    stats_ = s;
    beat_ = std::chrono::steady_clock::now();
    has_beat_ = true;
  }
  // Stats with heartbeat_age_seconds filled in (infinity before the first beat).
  EngineStats read() const {
    std::lock_guard<std::mutex> l(mu_);
    EngineStats s = stats_;
    s.heartbeat_age_seconds =
        has_beat_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - beat_).count() : 1e9;
    if (s.oldest_step_seconds > 0 && has_beat_) s.oldest_step_seconds += s.heartbeat_age_seconds;  // (up to now)
    return s;
  }

 private:
  mutable std::mutex mu_;
  EngineStats stats_;
  std::chrono::steady_clock::time_point beat_;
  bool has_beat_ = false;
};

struct SeqInfo {
  request_sink_actor sink;
  bool known_to_worker = false;  // the last stage holds its sampler state
  bool sent_first = false;
  std::chrono::steady_clock::time_point submitted;
  double queue_seconds = -1;  // submission to first scheduled step
  NewSeqSampling sampling;    // sent with the first plan that samples it
};

struct SchedulerState {
  SchedulerActorConfig cfg;
  std::unique_ptr<KvLedger> ledger;
  std::unique_ptr<Scheduler> sched;
  stage_actor first_stage;
  kv_block_actor kv_actor;
  bool kv_waiting = false;  // a KvOpsRequest is out (awaited)
  uint64_t kv_batch = 0;
  std::shared_ptr<StatsBoard> board;
  std::map<int64_t, SeqInfo> seqs;
  std::vector<int64_t> released;
  std::map<uint64_t, StepPlan> plans;                              // the plans in flight, by step number
  std::map<uint64_t, std::chrono::steady_clock::time_point> sent;  // when each was sent
  uint64_t step_no = 0;
  size_t most_in_flight = 0;  // the largest number of plans in flight so far
  EngineStats stats;
  bool drop_cached = false;  // the next KV request first forgets cached blocks (a stage rejoined)
  static inline const char* name = "scheduler";
};

scheduler_actor::behavior_type scheduler_fn(scheduler_actor::stateful_pointer<SchedulerState> self,
                                            SchedulerActorConfig cfg, stage_actor first_stage, kv_block_actor kv_actor,
                                            std::shared_ptr<StatsBoard> board);

}  // namespace troupe::actors
