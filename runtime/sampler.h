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

#include "kernels/result.h"
#include "kernels/sample_params.h"
#include "runtime/json_constraint.h"

namespace troupe {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;  // 1: off (divides positive logits, multiplies negative)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::unordered_map<int32_t, float> logit_bias;
  uint64_t seed = 0;
  int32_t logprobs = 0;  // number of top alternatives to report (0: chosen token only)
  // The chosen token's log-probability (a log-softmax over the whole vocabulary); off when
  // nobody asked for logprobs: SampleResult::logprob is then 0 and the pass is skipped.
  bool report_logprob = true;
  // JSON mode: only tokens that keep the output one JSON object (runtime/json_constraint.h);
  // takes effect once the sampler has the tokens' bytes (Sampler::set_token_bytes).
  bool json_object = false;

  // Range, NaN and vocabulary checks; the error names the parameter.
  Status validate(int32_t vocab_size) const;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0;                // log-softmax of the unmodified logits
  std::vector<TokenLogprob> top;    // top `logprobs` alternatives, best first
};

class Sampler {
 public:
  Sampler(SamplingParams params, int32_t vocab_size);
  // The vocabulary's bytes, for JSON mode (params.json_object); without them it is off.
  void set_token_bytes(std::shared_ptr<const TokenBytes> tokens);
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
  std::optional<JsonConstraint> json_;  // JSON mode's state
};

}  // namespace troupe
