// The scheduler tests' fake model: the next token is a function of the sequence so far, so
// a request's output does not depend on how its steps were batched, chunked or preempted.
#pragma once
#include <cstdint>
#include <vector>

namespace troupe::test {

inline int32_t fake_next(const std::vector<int32_t>& toks) {
  int64_t h = 7;
  for (int32_t t : toks) h = (h * 31 + t) % 1000003;
  return static_cast<int32_t>(h % 50);
}

}  // namespace troupe::test
