#include "runtime/request/seq_request.h"

#include <cmath>
#include <string>

namespace troupe {

Status SamplingParams::validate(int32_t vocab) const {
  auto bad = [](const char* name, double v, const char* range) {
    return make_error(std::string(name) + " " + std::to_string(v) + " is out of range (" + range + ")");
  };
  if (!std::isfinite(temperature) || temperature < 0 || temperature > 100)
    return bad("temperature", temperature, "0..100");
  if (top_k < 0) return bad("top_k", top_k, ">= 0");
  if (!std::isfinite(top_p) || top_p <= 0 || top_p > 1) return bad("top_p", top_p, "(0, 1]");
  if (!std::isfinite(min_p) || min_p < 0 || min_p > 1) return bad("min_p", min_p, "[0, 1]");
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0 || repetition_penalty > 10)
    return bad("repetition_penalty", repetition_penalty, "(0, 10]");
  if (!std::isfinite(presence_penalty) || std::fabs(presence_penalty) > 2)
    return bad("presence_penalty", presence_penalty, "-2..2");
  if (!std::isfinite(frequency_penalty) || std::fabs(frequency_penalty) > 2)
    return bad("frequency_penalty", frequency_penalty, "-2..2");
  if (logprobs < 0 || logprobs > 20) return bad("logprobs", logprobs, "0..20");
  if (logit_bias.size() > 1024) return make_error("logit_bias has more than 1024 entries");
  for (const auto& [tok, b] : logit_bias) {
    if (tok < 0 || tok >= vocab)
      return make_error("logit_bias token " + std::to_string(tok) + " is outside the vocabulary");
    if (!std::isfinite(b) || std::fabs(b) > 100)
      return make_error("logit_bias value for token " + std::to_string(tok) + " must be finite and within -100..100");
  }
  if (grammar.size() > kMaxGrammarBytes)
    return make_error("grammar is over " + std::to_string(kMaxGrammarBytes) + " bytes");
  if (!grammar.empty() && json_object) return make_error("grammar and JSON mode cannot be combined");
  return {};
}

Status SeqRequest::validate(int32_t vocab, int64_t max_context) const {
  if (prompt.empty()) return make_error("empty prompt");
  if (max_new_tokens <= 0) return make_error("max_new_tokens must be at least 1");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab) return make_error("prompt token " + std::to_string(t) + " is outside the vocabulary");
  for (int32_t t : stop_token_ids)
    if (t < 0 || t >= vocab) return make_error("stop token " + std::to_string(t) + " is outside the vocabulary");
  if (static_cast<int64_t>(prompt.size()) + max_new_tokens > max_context)
    return make_error("prompt plus max_new_tokens exceeds the context of " + std::to_string(max_context));
  if (num_speculative_tokens < -1 || num_speculative_tokens > kMaxSpeculativeTokens)
    return make_error("num_speculative_tokens " + std::to_string(num_speculative_tokens) + " is out of range (-1.." +
                      std::to_string(kMaxSpeculativeTokens) + ")");
  return sampling.validate(vocab);
}

}  // namespace troupe
