// The straightforward sampling algorithm the sampler used before staged sorting: sort every
// candidate by logit (ties by id), normalise over the top-k, cut by min-p and top-p, walk
// the order with one uniform draw. The sampler test checks the staged version picks the
// same tokens; bench/cpu/sampler_bench.cpp times both on real logits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "runtime/sample/sampler.h"

namespace troupe::test {

inline int32_t full_sort_reference(const std::vector<float>& w, const SamplingParams& p, double u01) {
  const int32_t n = static_cast<int32_t>(w.size());
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  const int32_t k0 = p.top_k > 0 && p.top_k < n ? p.top_k : n;
  if (k0 < n)
    std::partial_sort(idx.begin(), idx.begin() + k0, idx.end(), better);
  else
    std::sort(idx.begin(), idx.end(), better);
  std::vector<double> probs(static_cast<size_t>(k0));
  double sum = 0;
  for (int32_t i = 0; i < k0; ++i)
    sum += probs[i] = std::exp(static_cast<double>(w[idx[i]] - w[idx[0]]) / p.temperature);
  for (auto& x : probs) x /= sum;
  int32_t k = k0;
  if (p.min_p > 0) {
    int32_t keep = 1;
    while (keep < k && probs[keep] >= probs[0] * p.min_p) ++keep;
    k = keep;
  }
  if (p.top_p < 1) {
    double c = 0;
    int32_t keep = 0;
    while (keep < k) {
      c += probs[keep++];
      if (c >= p.top_p) break;
    }
    k = std::max(1, keep);
  }
  double total = 0;
  for (int32_t i = 0; i < k; ++i) total += probs[i];
  double acc = 0;
  for (int32_t i = 0; i < k; ++i) {
    acc += probs[i];
    if (u01 * total < acc) return idx[i];
  }
  return idx[k - 1];
}
}  // namespace troupe::test
