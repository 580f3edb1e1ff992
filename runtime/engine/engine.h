// The continuous-batching engine core: the scheduler and KV-block manager decide each step,
// the step planner flattens the plan into StepInputs, the model runs one packed forward
// pass and each request's own sampler picks its token. Synchronous and single-threaded
// (the actors of issue 3 wrap it); results do not depend on batch neighbours.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "runtime/engine/self_draft.h"
#include "runtime/sched/kv_block_manager.h"
#include "runtime/model/model.h"
#include "runtime/sample/sampler.h"
#include "runtime/sched/kv_round.h"
#include "runtime/sched/scheduler.h"

namespace troupe {

struct EngineConfig {
  SchedulerConfig scheduler;
  KvBlockConfig kv;
};

struct EngineEvent {
  int64_t id = 0;
  int32_t token = -1;  // the token sampled this step
  float logprob = 0;
  bool finished = false;
  bool hit_stop = false;  // finished on a stop token (else on length)
};

// Flat step arrays for a plan (the step planner): built once per step, used by every layer.
struct PlannedStep {
  std::vector<int32_t> token_ids, positions, query_start, context_lens, slot_mapping, block_tables, logit_rows;
  std::vector<int64_t> logit_seq;  // request id of each logit row
  int32_t max_blocks_per_seq = 0;
  StepInputs inputs() const;
};
// The block tables come from `table(id)` (null: unknown sequence): the block manager's
// own, or the copies the KV-block-manager actor sent back.
using BlockTableFn = std::function<const std::vector<int32_t>*(int64_t)>;
Result<PlannedStep> plan_step(const StepPlan& plan, const Scheduler& sched, int32_t block_size,
                              const BlockTableFn& table);
Result<PlannedStep> plan_step(const StepPlan& plan, const Scheduler& sched, const KvBlockManager& kv);

class Engine {
 public:
  // is_stop: the model's end-of-generation tokens (besides each request's stop ids).
  static Result<std::unique_ptr<Engine>> create(Model& model, Backend& backend, const EngineConfig& cfg,
                                                SchedulingPolicy policy, std::function<bool(int32_t)> is_stop);
  Status add(SeqRequest r);  // (checked with SeqRequest::validate)
  void abort(int64_t id);
  bool has_work() const { return sched_->num_running() + sched_->num_waiting() > 0; }
  // Runs one step; returns one event per sampled token.
  Result<std::vector<EngineEvent>> step();
  const KvBlockManager& kv() const { return *kv_; }
  const Scheduler& scheduler() const { return *sched_; }
  // Speculative decoding: drafts from `d` (EngineConfig::scheduler.num_speculative_tokens at
  // most), verified in the same step; the tokens are those decoding without drafts gives.
  // The source is checked against the model first (DraftSource::bind).
  Status set_draft_source(std::unique_ptr<DraftSource> d) {
    TROUPE_TRY(d->bind(draft_target(model_->config())));
    draft_ = std::move(d);
    sched_->set_draft_source(draft_.get());
    return {};
  }
  // The plan the last step() ran (empty when it had nothing to do): what `troupe sim
  // calibrate` prices against the step's measured time.
  const StepPlan& last_plan() const { return last_plan_; }

 private:
  Model* model_ = nullptr;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<KvBlockManager> kv_;
  std::unique_ptr<DraftSource> draft_;  // (before sched_, which points at it)
  std::unique_ptr<Scheduler> sched_;
  std::function<bool(int32_t)> is_stop_;
  std::map<int64_t, Sampler> samplers_;
  std::vector<float> logits_;
  SelfDrafter drafter_;  // (--speculative self:L)
  StepPlan last_plan_;
};

}  // namespace troupe
