// The one rule for how many tokens a request may generate: its max_tokens, or whatever is
// left of the context; errors are worded as vLLM's and name the parameter to blame. Used by
// the request actor (after tokenization) and by the HTTP API layer.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace troupe {

struct ContextFit {
  int32_t max_new_tokens = 0;
  std::string error;  // empty: fits
  std::string param;  // `what` or "max_tokens"
  bool ok() const { return error.empty(); }
};

// what: "prompt" or "messages" (also the parameter named for prompt errors).
ContextFit fit_to_context(uint64_t prompt_tokens, std::optional<int32_t> max_tokens, int32_t max_context,
                          const std::string& what);

}  // namespace troupe
