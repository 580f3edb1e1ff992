// What a backend needs to sample one logits row itself (Backend::sample): the sampler's
// settings without the host-only parts (penalties, logit bias, top-logprob lists), which
// keep a request on the host. Plain data, shared by the host code and the CUDA kernel.
#pragma once
#include <cstdint>

namespace troupe {

struct DeviceSampleParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  uint64_t counter = 0;      // the draw's index: philox_uniform(seed, counter)
  int32_t want_logprob = 0;  // also return the chosen token's log-softmax
  int32_t on_device = 0;     // the caller's choice for this row (the kernel ignores it)
};

}  // namespace troupe
