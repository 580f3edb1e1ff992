// The f16/bf16 GEMV kernels' source (kernels/cuda/matmul.cu), run on the CPU through
// tests/kernels/cuda_emulation.h: the several-rows-per-warp kernel for 2..8 tokens must give
// the one-row kernel's bits, and every token's result in a group must equal what the
// one-token kernel computes for it alone (batch invariance), for ragged row counts, column
// counts off the vector width and unaligned activations.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/matmul.cu"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/fp16.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/gemv_epilogue_check.h"

using namespace troupe;

namespace {

template <bool BF16, int NT>
void check_group(const std::vector<uint8_t>& w, size_t row_bytes, int64_t rows, int64_t cols, int64_t ldx, int64_t n,
                 const float* xp, bool vec) {
  const unsigned groups = static_cast<unsigned>((n + NT - 1) / NT);
  std::vector<float> y_old(static_cast<size_t>(n * rows), -1.0f), y_new(y_old.size(), -2.0f);
  // One row per warp (blocks of kWarpsPerBlock rows) and R rows per warp; blockIdx.y picks
  // the token group.
  cuda_emu::launch3(static_cast<unsigned>((rows + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock), groups, 1,
                    cuda::kWarpsPerBlock * 32, cuda::gemv_half_kernel<BF16, NT, 4>, w.data(), row_bytes, rows, cols, xp,
                    ldx, n, vec, y_old.data(), int64_t{rows});
  const int64_t per_block = int64_t{cuda::kWarpsPerBlock} * cuda::kHalfRowsPerWarp;
  cuda_emu::launch3(static_cast<unsigned>((rows + per_block - 1) / per_block), groups, 1, cuda::kWarpsPerBlock * 32,
                    cuda::gemv_half_rows_kernel<BF16, NT, cuda::kHalfRowsPerWarp>, w.data(), row_bytes, cols, xp, ldx,
                    n, vec, cuda::RowsOut{y_new.data(), rows, rows});
  CHECK(std::memcmp(y_old.data(), y_new.data(), y_old.size() * 4) == 0);
  // Token by token through the one-token kernel: the same bits.
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> y1(static_cast<size_t>(rows), -3.0f);
    const float* x1 = xp + t * ldx;
    cuda_emu::launch3(static_cast<unsigned>((rows + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock), 1, 1,
                      cuda::kWarpsPerBlock * 32, cuda::gemv_half_kernel<BF16, 1, 4>, w.data(), row_bytes, rows, cols,
                      x1, ldx, int64_t{1}, vec, y1.data(), int64_t{rows});
    CHECK(std::memcmp(y1.data(), y_new.data() + t * rows, static_cast<size_t>(rows) * 4) == 0);
  }
}

}  // namespace

TEST_CASE("the several-rows-per-warp f16/bf16 GEMV kernel's source gives the one-row kernel's bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(8);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // (44: aligned x whose last vector has one whole 16-byte half: the staged kernels load it as one)
  for (int64_t cols : {44, 45, 1000}) {
    for (int64_t rows : {5, 33}) {  // ragged for both kernels (4 and 16 rows per block)
      const int64_t padded = (cols + 31) / 32 * 32;
      const size_t row_bytes = static_cast<size_t>(padded) * 2;
      for (bool bf16 : {true, false}) {
        std::vector<uint8_t> w(row_bytes * static_cast<size_t>(rows), 0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const uint16_t h = bf16 ? f32_to_bf16(nd(g)) : f32_to_f16(nd(g));
            std::memcpy(w.data() + r * row_bytes + c * 2, &h, 2);
          }
        for (int64_t n : {2, 7, 11}) {
          // x rows at a stride of 4 to 7 floats past cols, a multiple of 4 (aligned: vector
          // loads, also where cols is not a multiple of 4), and one float off (unaligned:
          // scalar loads).
          const int64_t ldx = (cols + 7) / 4 * 4;
          std::vector<float> x(static_cast<size_t>(n * ldx + 4));
          for (auto& v : x) v = nd(g);
          for (bool aligned : {true, false}) {
            // NaN past cols in each row: a kernel that reads it there (its weights are zero)
            // gives NaN instead of the one-row kernel's value.
            std::vector<float> xc = x;
            const int64_t off = aligned ? 0 : 1;
            for (int64_t t = 0; t < n; ++t)
              for (int64_t c = cols; c < ldx; ++c) xc[static_cast<size_t>(off + t * ldx + c)] = std::nanf("");
            const float* xp = xc.data() + off;
            const bool vec = aligned && ldx % 4 == 0;
            INFO("cols " << cols << " rows " << rows << (bf16 ? " bf16" : " f16") << " n " << n
                         << (aligned ? " aligned" : " unaligned"));
            if (n == 2)
              bf16 ? check_group<true, 2>(w, row_bytes, rows, cols, ldx, n, xp, vec)
                   : check_group<false, 2>(w, row_bytes, rows, cols, ldx, n, xp, vec);
            else if (n <= 4)
              bf16 ? check_group<true, 4>(w, row_bytes, rows, cols, ldx, n, xp, vec)
                   : check_group<false, 4>(w, row_bytes, rows, cols, ldx, n, xp, vec);
            else
              bf16 ? check_group<true, 8>(w, row_bytes, rows, cols, ldx, n, xp, vec)
                   : check_group<false, 8>(w, row_bytes, rows, cols, ldx, n, xp, vec);
          }
        }
      }
    }
  }
}

TEST_CASE("the one-token several-rows-per-warp GEMV kernel's source gives the one-row kernel's bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto run_type = [&]<DType T>(int64_t cols) {
    for (int64_t rows : {5, 33}) {
      size_t rb = 0;  // (rows in the device layout)
      const auto w = test::device_rows(T, test::random_weight(T, rows, cols, g), rows, cols, &rb);
      std::vector<float> x(static_cast<size_t>(cols));
      for (auto& v : x) v = nd(g);
      std::vector<float> one(static_cast<size_t>(rows), -1.0f), four(one.size(), -2.0f);
      cuda_emu::launch3(static_cast<unsigned>((rows + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock), 1, 1,
                        cuda::kWarpsPerBlock * 32, cuda::gemv_kernel<T, 1>, static_cast<const uint8_t*>(w.data()), rb,
                        rows, cols, static_cast<const float*>(x.data()), cols, int64_t{1}, one.data(), rows);
      const int64_t per_block = int64_t{cuda::kWarpsPerBlock} * cuda::kHalfRowsPerWarp;
      cuda_emu::launch(static_cast<unsigned>((rows + per_block - 1) / per_block), cuda::kWarpsPerBlock * 32,
                       cuda::gemv_rows_kernel<T, cuda::kHalfRowsPerWarp>, static_cast<const uint8_t*>(w.data()), rb,
                       rows, cols, static_cast<const float*>(x.data()), four.data());
      INFO(dtype_traits(T).name << " rows " << rows << " cols " << cols);
      CHECK(std::memcmp(one.data(), four.data(), one.size() * 4) == 0);
    }
  };
  run_type.template operator()<DType::F32>(45);
  run_type.template operator()<DType::F32>(1100);
  run_type.template operator()<DType::Q4_K>(1280);
  run_type.template operator()<DType::Q5_K>(512);
  run_type.template operator()<DType::Q6_K>(768);
}

namespace {

// The f16/bf16 GEMV's fused SiLU and RoPE + KV-write epilogues (gemv_epilogue.cuh) against
// the one-row kernel's sums put through silu_mul and rope + kv_write (gemv_epilogue_check.h).
template <bool BF16, int NT>
void check_half_epilogues(std::mt19937& g, int64_t cols, int64_t n, bool aligned) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t row_bytes = static_cast<size_t>((cols + 31) / 32 * 32) * 2;
  std::vector<float> xs(static_cast<size_t>(n * cols + 1));
  for (auto& v : xs) v = nd(g);
  const float* x = xs.data() + (aligned ? 0 : 1);
  const bool vec = aligned && cols % 4 == 0;
  auto weight = [&](int64_t rows) {
    std::vector<uint8_t> w(row_bytes * static_cast<size_t>(rows), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t h = BF16 ? f32_to_bf16(nd(g)) : f32_to_f16(nd(g));
        std::memcpy(w.data() + r * row_bytes + c * 2, &h, 2);
      }
    return w;
  };
  const unsigned groups = static_cast<unsigned>((n + NT - 1) / NT);
  auto plain_of = [&](const std::vector<uint8_t>& w) {
    return [&, wp = &w](float* y, int64_t rows) {
      cuda_emu::launch3(static_cast<unsigned>((rows + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock), groups, 1,
                        cuda::kWarpsPerBlock * 32, cuda::gemv_half_kernel<BF16, NT, 4>, wp->data(), row_bytes, rows,
                        cols, x, cols, n, vec, y, rows);
    };
  };
  auto fused_launch = [&]<int R>(const std::vector<uint8_t>& w, auto out) {
    using E = decltype(out);
    const int64_t per_block = int64_t{cuda::kWarpsPerBlock} * (R / E::kRows);
    cuda_emu::launch3(static_cast<unsigned>((out.items() + per_block - 1) / per_block), groups, 1,
                      cuda::kWarpsPerBlock * 32, cuda::gemv_half_rows_kernel<BF16, NT, R, E>, w.data(), row_bytes, cols,
                      x, cols, n, vec, out);
  };
  for (int64_t ffn : {6, 19}) {
    const auto w = weight(2 * ffn);
    test::check_silu_epilogue(ffn, n, plain_of(w), [&](cuda::SiluOut o) { fused_launch.template operator()<2>(w, o); });
    test::check_silu_epilogue(ffn, n, plain_of(w), [&](cuda::SiluOut o) { fused_launch.template operator()<4>(w, o); });
  }
  for (bool neox : {false, true}) {
    const int64_t nh = 4, nkv = 2, hd = 16;
    const auto w = weight((nh + 2 * nkv) * hd);
    test::check_rope_epilogue(nh, nkv, hd, n, neox, g, plain_of(w),
                              [&](cuda::RopeKvOut o) { fused_launch.template operator()<2>(w, o); });
  }
}

}  // namespace

TEST_CASE("the f16/bf16 GEMV's fused SiLU and RoPE + KV-write epilogues give the unfused ops' bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(15);
  check_half_epilogues<true, 1>(g, 64, 1, true);
  check_half_epilogues<false, 1>(g, 45, 1, false);
  check_half_epilogues<true, 4>(g, 300, 3, false);
  check_half_epilogues<false, 4>(g, 300, 3, true);  // (300: the last vector's second half is past cols)
  check_half_epilogues<false, 8>(g, 64, 10, true);
  check_half_epilogues<true, 2>(g, 1000, 2, true);
}
