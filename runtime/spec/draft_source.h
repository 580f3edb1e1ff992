// Where speculative drafts come from (issue 35): one interface for every method, so the
// scheduler core plans drafts the same way whatever proposes them. A source is asked, for
// one decoding sequence, for at most `max` tokens likely to follow `tokens` (the prompt and
// what was generated so far); it may return fewer, or none (nothing worth feeding: the
// sequence then decodes one token as usual). Proposals are guesses only: the target model
// verifies every one in the same packed step (runtime/sample/speculative.h), so a source
// can never change the output, only how many steps it takes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace troupe {

// A draft the worker fills in: a source whose drafts need the target's own layers
// (self-drafting) proposes this many placeholders; the step carries them to the worker,
// which runs the draft rounds over the KV it holds and writes the tokens in before the
// verifying pass (runtime/engine/self_draft.h). Never a vocabulary id, so a worker that
// cannot fill them refuses the step.
constexpr int32_t kWorkerDraft = -1;

// What a source learns of the target once the model is known (DraftSource::bind).
struct DraftTarget {
  int32_t num_layers = 0;
  // The LM head's weights as a multiple of one layer's (what a draft round pays besides
  // its layers).
  double head_layers = 0;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // The method's name as `troupe serve --speculative` spells it ("ngram", "self:8", ...).
  virtual std::string name() const = 0;
  virtual std::vector<int32_t> propose(int64_t seq, const std::vector<int32_t>& tokens, int32_t max) = 0;
  // The sequence is gone (finished, cancelled, preempted): state kept for it can go.
  virtual void release(int64_t /*seq*/) {}
  // Checks the source against the target model (an error names what does not fit).
  virtual Status bind(const DraftTarget& /*target*/) { return {}; }
  // Self-drafting: how many of the target's first layers a draft round runs (0: the
  // source proposes real tokens itself).
  virtual int32_t self_draft_layers() const { return 0; }
  // A draft round's cost as a fraction of a one-token decode step, before any is measured
  // (0: proposing costs nothing next to the step).
  virtual double round_cost_estimate() const { return 0; }
};

// Self-drafting (layer skipping): the target's first L layers, its final norm and LM head
// are the draft model; their KV for those layers is the target's own (the verifying pass
// rewrites it with the same values), so drafting needs no second file and no second KV.
class SelfDraft : public DraftSource {
 public:
  explicit SelfDraft(int32_t layers) : layers_(layers) {}
  std::string name() const override { return "self:" + std::to_string(layers_); }
  std::vector<int32_t> propose(int64_t, const std::vector<int32_t>&, int32_t max) override {
    return std::vector<int32_t>(static_cast<size_t>(std::max(0, max)), kWorkerDraft);
  }
  Status bind(const DraftTarget& t) override;
  int32_t self_draft_layers() const override { return layers_; }
  double round_cost_estimate() const override { return round_cost_; }

 private:
  int32_t layers_;
  double round_cost_ = 0;
};

// The source `--speculative METHOD` names: "ngram" (prompt lookup) or "self:L" (the
// target's first L layers). An unknown method is an error that lists the known ones.
Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& method);

}  // namespace troupe
