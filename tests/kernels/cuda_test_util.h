// What the [cuda] op tests share: a CUDA backend or a printed skip, uploads and read-backs
// that fail the test on a device error, and a count from the backend's stats line.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/test_util.h"

namespace troupe::test {

inline std::unique_ptr<Backend> gpu_or_skip(bool batch_invariant = true, bool tc_gemm = false) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) {
    WARN("skipped: " << why);
    return nullptr;
  }
  CudaBackendOptions o;
  o.batch_invariant = batch_invariant;
  o.tc_gemm = tc_gemm;
  auto b = make_cuda_backend(o);
  if (!b) FAIL(b.error().message);
  return std::move(*b);
}

inline float* put(Backend& b, const std::vector<float>& v) { return b.upload(v); }
inline std::vector<float> get(Backend& b, const float* p, size_t n) {
  std::vector<float> v(n);
  b.copy_out(v.data(), p, n);
  auto st = b.sync();
  if (!st.ok()) FAIL(b.name() << ": " << st.error().message);
  return v;
}

// Every element: |a - b| <= abs_tol + rel_tol * |b|.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double abs_tol, double rel_tol,
                         const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= abs_tol + rel_tol * std::fabs(want[i]))) {
      if (!bad) first = i;
      ++bad;
    }
    worst = std::max(worst, d);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements out of tolerance; first at " << first << " (got "
            << (bad ? got[first] : 0) << ", want " << (bad ? want[first] : 0) << "); max abs diff " << worst);
  CHECK(bad == 0);
}

// The number after `key` in the backend's stats line.
inline uint64_t stats_count(const Backend& b, const std::string& key) {
  const std::string st = b.stats();
  const size_t at = st.find(key);
  REQUIRE(at != std::string::npos);
  return std::stoull(st.substr(at + key.size()));
}

}  // namespace troupe::test
