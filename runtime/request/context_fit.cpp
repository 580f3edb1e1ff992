#include "runtime/request/context_fit.h"

#include <algorithm>

namespace troupe {

ContextFit fit_to_context(uint64_t prompt_tokens, std::optional<int32_t> max_tokens, int32_t max_context,
                          const std::string& what) {
  ContextFit f;
  const uint64_t ctx = static_cast<uint64_t>(std::max(max_context, 0));
  const std::string head = "This model's maximum context length is " + std::to_string(ctx) + " tokens. ";
  if (prompt_tokens == 0) {
    f.error = "the " + what + " must not be empty";
    f.param = what;
  } else if (max_tokens && prompt_tokens + static_cast<uint64_t>(*max_tokens) > ctx) {
    f.error = head + "However, you requested " + std::to_string(prompt_tokens + *max_tokens) + " tokens (" +
              std::to_string(prompt_tokens) + " in the " + what + ", " + std::to_string(*max_tokens) +
              " in the completion). Please reduce the length of the " + what + " or completion.";
    f.param = "max_tokens";
  } else if (prompt_tokens >= ctx) {
    f.error = head + "However, your " + what + " has " + std::to_string(prompt_tokens) +
              " tokens, which leaves no room for the completion. Please reduce the length of the " + what + ".";
    f.param = what;
  } else {
    f.max_new_tokens = max_tokens ? *max_tokens : static_cast<int32_t>(ctx - prompt_tokens);
  }
  return f;
}

}  // namespace troupe
