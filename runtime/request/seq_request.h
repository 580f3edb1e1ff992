// One sequence to generate, the single request type every layer carries: the OpenAI parser
// fills one per request (apps/serve/openai_request.h), the request actor sends one per choice
// to the scheduler actor, the engine takes one per add(), and the scheduler keeps it in its
// per-sequence state. docs/architecture.md ("Adding a field to a request") lists the places
// a new field touches.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace troupe {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off (divides positive logits, multiplies negative)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::unordered_map<int32_t, float> logit_bias;
  uint64_t seed = 0;
  int32_t logprobs = 0;  // number of top alternatives to report (0: chosen token only)
  // The chosen token's log-probability (a log-softmax over the whole vocabulary); off when
  // nobody asked for logprobs: SampleResult::logprob is then 0 and the pass is skipped.
  bool report_logprob = true;
  // JSON mode: only tokens that keep the output one JSON object (runtime/sample/json_constraint.h);
  // takes effect once the sampler has the tokens' bytes (Sampler::set_token_bytes).
  bool json_object = false;
  // Structured output: a GBNF grammar (runtime/grammar/grammar.h) the output must match --
  // what json_schema, guided_regex, guided_choice and guided_grammar become
  // (runtime/grammar/json_schema.h); empty: none. Takes effect once the sampler has the
  // grammar's table (Sampler::set_grammar).
  std::string grammar;
  static constexpr size_t kMaxGrammarBytes = 1u << 20;

  // Range, NaN and vocabulary checks; the error names the parameter.
  Status validate(int32_t vocab_size) const;
};

// The most draft tokens a step may verify for one sequence (server flag and request field).
constexpr int32_t kMaxSpeculativeTokens = 16;

struct SeqRequest {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 16;
  int32_t priority = 0;  // lower runs first under the priority policy
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // besides the model's end-of-generation tokens
  bool ignore_eos = false;              // the model's end-of-generation tokens do not stop it
  // Speculative decoding for this request: -1 the server's setting, 0 none, else at most
  // this many draft tokens a step (never more than the server's --num-speculative-tokens).
  int32_t num_speculative_tokens = -1;

  // A non-empty prompt and stop tokens inside the vocabulary, at least one new token, prompt
  // plus new tokens within `max_context`, sampling parameters in range (the error names what).
  Status validate(int32_t vocab_size, int64_t max_context) const;
};

}  // namespace troupe
