// Pipeline-stage actor: a contiguous range of layers [first, last) and the worker that runs
// them. A step arrives as a StageStep (the flat plan; activations from the previous stage);
// a middle stage forwards its activations to the next stage, the last stage samples one
// token per logit row (it keeps each sequence's sampler state) and answers the step's sink.
// Blocking compute: spawn it `detached` in a server (its own thread); tests spawn it plainly.
#pragma once
#include <map>
#include <memory>

#include "actors/messages.h"
#include "kernels/backend.h"
#include "runtime/kv_block_manager.h"
#include "runtime/model.h"

namespace troupe::actors {

// The worker: one device (the CPU backend here, CUDA later) with the stage's weights and KV.
struct StageWorker {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  // Makes the stage's KV cache (its layers only) for the block pool the scheduler manages.
  static Result<std::shared_ptr<StageWorker>> create(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
                                                     const KvBlockConfig& kv);
};

struct StageState {
  std::shared_ptr<StageWorker> worker;
  stage_actor next;                       // invalid on the last stage
  std::map<int64_t, Sampler> samplers;    // last stage only
  std::vector<float> logits;              // [rows, vocab]
  std::vector<float> hidden_out;          // [num_tokens, hidden]
  static inline const char* name = "stage";
};

stage_actor::behavior_type stage_fn(stage_actor::stateful_pointer<StageState> self, std::shared_ptr<StageWorker> worker,
                                    stage_actor next);

// Checks that the flat arrays of a step are consistent in size (before any pointer is made
// from them); the model then checks values (ids, positions, blocks).
Status check_step_shape(const StageStep& s, int32_t hidden, bool needs_hidden);

}  // namespace troupe::actors
