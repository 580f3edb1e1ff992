// Worker actor: binds one device (the CPU backend's threads, or one CUDA device and its
// stream, through the same Backend interface) and runs one pipeline stage's layers. It owns
// the backend, the stage's weights and the stage's KV layers; nothing else touches them.
// Its stage actor sends it the flat step (with the previous stage's activations) and gets
// back the same step carrying this stage's activations, or, on the last stage, the logits
// of the step's logit rows. Blocking compute: spawn it `detached` in a server (its own
// thread); tests spawn it plainly under the test coordinator.
#pragma once
#include <memory>

#include "actors/messages.h"
#include "kernels/backend.h"
#include "runtime/engine/self_draft.h"
#include "runtime/sched/kv_block_manager.h"
#include "runtime/model/model.h"

namespace troupe::actors {

// What a worker binds: one device with the stage's weights and KV.
struct StageWorker {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  // Expert parallelism: where the model's routed experts run (the model holds a raw pointer).
  std::shared_ptr<ExpertDispatcher> dispatcher;
  // Fault injection (tests; `troupe serve --debug-fail-step`): the step with this number
  // fails with an error instead of running (0: never).
  uint64_t fail_step = 0;
  // Fault injection (`--debug-hang-step`): the step with this number hangs, as a hung device
  // would, until release_injected_hangs() (shutdown), then fails.
  uint64_t hang_step = 0;
  // Self-drafting (`--speculative self:L`, a whole-model stage only): a step's kWorkerDraft
  // tokens are drafted by the first `self_draft_layers` layers before it runs (0: refused).
  int32_t self_draft_layers = 0;
  // Makes the stage's KV cache (its layers only) for the block pool the scheduler manages.
  static Result<std::shared_ptr<StageWorker>> create(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
                                                     const KvBlockConfig& kv);
};

struct WorkerState {
  WorkerState() = default;  // not an aggregate: CAF would try to build it from the actor pointer
  std::shared_ptr<StageWorker> device;
  std::vector<float> out;  // this stage's activations [num_tokens, hidden] (swapped into the reply)
  SelfDrafter drafter;
  static inline const char* name = "worker";
};

worker_actor::behavior_type worker_fn(worker_actor::stateful_pointer<WorkerState> self,
                                      std::shared_ptr<StageWorker> device);

// Lets every worker hung by `hang_step` go (its step then fails); for shutdown.
void release_injected_hangs();

// Checks that the flat arrays of a step are consistent in size (before any pointer is made
// from them); the model then checks values (ids, positions, blocks).
Status check_step_shape(const StageStep& s, int32_t hidden, bool needs_hidden);

}  // namespace troupe::actors
