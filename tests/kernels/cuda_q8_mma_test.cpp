// The int8 matmul on tensor cores (kernels/cuda/matmul_q8.cu, gemm_q8_mma_kernel; opt-in with
// TROUPE_CUDA_Q8_MMA) against the int8 GEMV through the backend, bit for bit. Tagged [cuda];
// without a GPU it prints why it is skipped (host-run runs it over the fake device).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <random>

#include "kernels/backend.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;
using test::get;
using test::gpu_or_skip;
using test::put;
using test::stats_count;

TEST_CASE("cuda: the int8 matmuls on tensor cores (TROUPE_CUDA_Q8_MMA) give the GEMV's bits",
          "[cuda][kernels][batch]") {
  // From 16 tokens on the mma kernel runs (70 tokens: two 64-token blocks, the second
  // ragged; 200 rows: a ragged 16-row tile); single tokens still take the GEMV, so each
  // token alone must get the bits it gets in the batch, and the whole batch the GEMV's.
  auto gemv = gpu_or_skip();
  if (!gemv) return;
  auto mma = [] {
    test::EnvScope e("TROUPE_CUDA_Q8_MMA", "16");
    return gpu_or_skip();
  }();
  std::mt19937 rng(16);
  const int64_t rows = 200, n = 70;
  for (const DType t :
       {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const int64_t cols = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K ? 768 : 1536;
    INFO(dtype_traits(t).name << " " << rows << " x " << cols << ", " << n << " tokens");
    auto data = test::random_weight(t, rows, cols, rng);
    auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
    auto run = [&](Backend& b, int64_t first, int64_t m) {
      auto w = b.make_weight(t, cols, {{data.data(), rows}});
      REQUIRE(w.ok());
      float* px = put(b, std::vector<float>(x.begin() + first * cols, x.begin() + (first + m) * cols));
      float* y = b.alloc(static_cast<size_t>(m * rows));
      b.matmul(**w, px, m, y, rows);
      return get(b, y, static_cast<size_t>(m * rows));
    };
    const uint64_t before = stats_count(*mma, "int8 matmuls on tensor cores: ");
    const auto want = run(*gemv, 0, n);
    const auto got = run(*mma, 0, n);
    CHECK(stats_count(*mma, "int8 matmuls on tensor cores: ") == before + 1);
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += std::memcmp(&want[i], &got[i], 4) != 0;
    CHECK(differ == 0);
    for (const int64_t i : {0L, 33L, 69L}) {  // alone (the GEMV) in the mma backend
      const auto one = run(*mma, i, 1);
      CHECK(std::memcmp(one.data(), got.data() + i * rows, static_cast<size_t>(rows) * 4) == 0);
    }
  }
}
