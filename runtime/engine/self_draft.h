// Self-drafting (speculative decoding with `--speculative self:L`): the draft rounds a
// worker runs inside a step before the verifying pass. A step whose sequences end in
// kWorkerDraft placeholders (runtime/spec/draft_source.h) is drafted here: round 0 feeds
// each such sequence's known tokens of the step through the target's first L layers, its
// final norm and LM head (Model::forward_draft) and takes the argmax as the first draft;
// round r feeds draft r and takes draft r + 1, every drafting sequence batched in one pass
// a round. The rounds write layers [0, L) of the KV at the draft positions, which the
// scheduler reserved for the step; the verifying pass then rewrites every layer there from
// the same tokens, so what the target computes is what it computes without drafting.
#pragma once
#include <vector>

#include "runtime/model/model.h"
#include "runtime/spec/draft_source.h"

namespace troupe {

// What a draft source needs to know of the target (DraftSource::bind): its layers and how
// many layers' worth of weights its LM head reads.
DraftTarget draft_target(const ModelConfig& cfg);

class SelfDrafter {
 public:
  // Whether any token of the step is a placeholder.
  static bool wants_drafts(const StepInputs& step);
  // Fills every placeholder of `tokens` (the step's own token_ids, which `step` points at)
  // with a draft of the model's first `layers` layers. An error when a placeholder is not
  // among its sequence's trailing tokens or has no known token before it.
  Status fill(Model& model, KvCache& cache, int32_t layers, const StepInputs& step, int32_t* tokens);
  int32_t last_rounds() const { return rounds_; }  // the rounds the last fill ran

 private:
  struct Seq {
    int32_t index, begin, first_draft, drafts;
  };
  std::vector<Seq> seqs_;
  std::vector<int32_t> ids_, pos_, qs_, ctx_, slots_, tables_, rows_;
  std::vector<float> logits_;
  int32_t rounds_ = 0;
};

}  // namespace troupe
