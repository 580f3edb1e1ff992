// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence /
// frequency penalties, logit bias, per-request seeds and logprobs. A Sampler holds one
// request's state (its draw counter and the tokens it has seen), so results never depend on
// what else is in the batch. Draws are counter-based (Philox4x32-10 of the seed and the
// draw's index, kernels/philox.h), so a backend that samples on the device
// (Backend::sample) makes the same draw for the same token.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "kernels/sample_params.h"
#include "runtime/request/seq_request.h"  // SamplingParams
#include "runtime/sample/grammar_constraint.h"
#include "runtime/sample/json_constraint.h"

namespace troupe {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0;              // log-softmax of the unmodified logits
  std::vector<TokenLogprob> top;  // top `logprobs` alternatives, best first
};

class Sampler {
 public:
  Sampler(SamplingParams params, int32_t vocab_size);
  // The vocabulary's bytes, for JSON mode (params.json_object); without them it is off.
  void set_token_bytes(std::shared_ptr<const TokenBytes> tokens);
  // The compiled table of params.grammar (runtime/sample/grammar_constraint.h).
  void set_grammar(std::shared_ptr<GrammarTable> table);
  // Tokens that count for penalties (the prompt for repetition, generated for all).
  void add_prompt(const std::vector<int32_t>& tokens);
  void accept(int32_t token);
  // logits: [vocab] (not modified). Each call is one draw (greedy ones too).
  SampleResult sample(const float* logits);

  // Whether a backend may make this request's draws (Backend::sample): no penalties, no
  // logit bias, no top-logprob lists. device_params() describes the next draw (on_device
  // set when eligible); device_draw() takes the token a backend drew and counts the draw
  // (then accept() it as usual); skip_draw() counts a draw without a token.
  bool device_eligible() const;
  DeviceSampleParams device_params() const;
  Result<SampleResult> device_draw(int32_t token, float logprob);
  void skip_draw() { ++draws_; }
  uint64_t draws() const { return draws_; }

 private:
  SamplingParams p_;
  int32_t vocab_;
  uint64_t draws_ = 0;  // sample() calls and device draws so far: the next draw's counter
  std::unordered_map<int32_t, int32_t> generated_counts_;
  std::vector<uint8_t> seen_;  // prompt or generated, for the repetition penalty
  std::vector<float> work_;
  std::vector<int32_t> idx_;
  std::optional<JsonConstraint> json_;        // JSON mode's state
  std::optional<GrammarConstraint> grammar_;  // structured output's state
};

}  // namespace troupe
