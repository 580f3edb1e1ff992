// Pipeline-stage actor: a contiguous range of layers [first, last), run by its worker actor
// (actors/worker_actor.h, which binds the device). A step arrives as a StageStep (the flat
// plan; activations from the previous stage) and goes to the worker; a middle stage
// forwards the worker's activations to the next stage, the last stage samples one token
// per logit row from the worker's logits (it keeps each sequence's sampler state) and
// answers the step's sink. Steps reach the worker, and their results come back, in order,
// so a later plan always finds the KV an earlier plan wrote. The stage itself never
// blocks: it can share a thread with other actors.
#pragma once
#include <map>

#include "actors/messages.h"
#include "runtime/sample/sampler.h"

namespace troupe::actors {

struct StageState {
  StageState() = default;  // not an aggregate: CAF would try to build it from the actor pointer
  worker_actor worker;
  stage_actor next;  // invalid on the last stage
  bool is_last = true;
  int32_t vocab = 0;                              // last stage: the logits' row length
  std::shared_ptr<const TokenBytes> token_bytes;  // last stage: for JSON mode (null: none)
  std::unique_ptr<GrammarCache> grammars;         // last stage: structured output's compiled grammars
  std::map<int64_t, Sampler> samplers;            // last stage only
  // A new sequence whose id still has a sampler (the id was released in a step whose
  // answer has not come back): its sampler waits here, with the step that brought it,
  // until that step's answer installs it after the release.
  std::map<int64_t, std::pair<uint64_t, Sampler>> pending;
  static inline const char* name = "stage";
};

stage_actor::behavior_type stage_fn(stage_actor::stateful_pointer<StageState> self, worker_actor worker,
                                    stage_actor next, int32_t vocab,
                                    std::shared_ptr<const TokenBytes> token_bytes = nullptr);

}  // namespace troupe::actors
