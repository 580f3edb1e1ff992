// The batch-invariant tensor-core matmul's source (kernels/cuda/matmul_tc.cu), run on the
// CPU through tests/kernels/cuda_emulation.h (WMMA emulated per element): the small-batch
// kernel (a block per 16 rows x 16 tokens, a warp per 512-column slice, rounds of 8 slices)
// and the tiled kernel (128 rows x 64 tokens, slices folded in registers) must give the same
// bits for a token wherever it sits in whichever batch, for ragged rows and tokens, column
// counts with a short last slice and with more slices than warps; every output must be near
// a double reference of the same rounded inputs, and nothing outside the output written.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/matmul_tc.cu"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

using namespace troupe;

namespace {

template <typename H>
H to_h(float v) {
  if constexpr (std::is_same_v<H, __half>)
    return __float2half_rn(v);
  else
    return __float2bfloat16_rn(v);
}

template <typename H>
float to_f(H v) {
  if constexpr (std::is_same_v<H, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}

template <typename H>
struct Case {
  int64_t rows, cols, kp, ldx, ldy;
  cuda_emu::device_vector<H> w;  // [rows, kp], zero past cols
  std::vector<float> x;          // [n_max, ldx]

  Case(int64_t r, int64_t c, int64_t n_max, std::mt19937& g)
      : rows(r), cols(c), kp((c + 31) / 32 * 32), ldx(c + 3), ldy(r + 2) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    w.assign(static_cast<size_t>(rows * kp), to_h<H>(0.0f));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < cols; ++k) w[i * kp + k] = to_h<H>(0.05f * nd(g));
    x.resize(static_cast<size_t>(n_max * ldx));
    for (auto& v : x) v = nd(g);
  }

  // Tokens first .. first + n - 1 through the converter and the chosen kernel.
  std::vector<float> run(int64_t first, int64_t n, bool large, cuda_emu::device_vector<H>* xh_out = nullptr) const {
    const int64_t n_pad = (n + cuda::kTokenPad - 1) / cuda::kTokenPad * cuda::kTokenPad;
    cuda_emu::device_vector<H> xh(static_cast<size_t>(n_pad * kp), to_h<H>(-9.0f));
    const float* xp = x.data() + first * ldx;
    // (the scalar converter: x's rows at ldx = cols + 3 are not 16-byte aligned; the vector
    // one's bits are checked against it in elementwise_emu_test.cpp)
    cuda_emu::launch(3, 64, cuda::to_half_rows_kernel<H, false>, xp, ldx, n, cols, kp, n_pad, xh.data());
    std::vector<float> y(static_cast<size_t>(n * ldy), -7.0f);
    if (large)
      cuda_emu::launch3(static_cast<unsigned>((rows + cuda::kBM - 1) / cuda::kBM),
                        static_cast<unsigned>((n + cuda::kBN - 1) / cuda::kBN), 1, cuda::kLargeWarps * 32,
                        cuda::gemm_tc_large_kernel<H>, static_cast<const H*>(w.data()), kp, rows, kp,
                        static_cast<const H*>(xh.data()), n, y.data(), ldy);
    else
      cuda_emu::launch3(static_cast<unsigned>((rows + cuda::kF - 1) / cuda::kF),
                        static_cast<unsigned>(n_pad / cuda::kF), 1, cuda::kSmallWarps * 32,
                        cuda::gemm_tc_small_kernel<H>, static_cast<const H*>(w.data()), kp, rows, kp,
                        static_cast<const H*>(xh.data()), n, y.data(), ldy);
    if (xh_out) *xh_out = xh;
    return y;
  }
};

template <typename H>
void check_case(int64_t rows, int64_t cols, std::mt19937& g) {
  const int64_t n_all = 70;  // two token tiles of the tiled kernel, the second ragged
  Case<H> c(rows, cols, n_all, g);
  cuda_emu::device_vector<H> xh;
  const auto all = c.run(0, n_all, true, &xh);
  INFO("rows " << rows << " cols " << cols << (std::is_same_v<H, __half> ? " f16" : " bf16"));
  // The converter: rounded values, zeros past the columns and past the tokens.
  {
    size_t bad = 0;
    for (int64_t t = 0; t < 80; ++t)
      for (int64_t k = 0; k < c.kp; ++k) {
        const float want = t < n_all && k < cols ? to_f(to_h<H>(c.x[t * c.ldx + k])) : 0.0f;
        if (to_f(xh[t * c.kp + k]) != want) ++bad;
      }
    CHECK(bad == 0);
  }
  // Near the double reference of the rounded inputs; the output's padding untouched.
  size_t far = 0, touched = 0;
  for (int64_t t = 0; t < n_all; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double(to_f(c.w[r * c.kp + k])) * to_f(xh[t * c.kp + k]);
        s += p;
        mag += std::fabs(p);
      }
      if (!(std::fabs(all[t * c.ldy + r] - s) <= 1e-5 + 1e-5 * mag)) ++far;
    }
    for (int64_t r = rows; r < c.ldy; ++r) touched += all[t * c.ldy + r] != -7.0f;
  }
  CHECK(far == 0);
  CHECK(touched == 0);
  // The same tokens in other batches, through both kernels: the same bits.
  struct Batch {
    int64_t first, n;
    bool large;
  };
  for (const Batch& b : {Batch{0, 1, false}, Batch{3, 5, false}, Batch{30, 21, false}, Batch{37, 32, false},
                         Batch{30, 21, true}, Batch{69, 1, true}}) {
    const auto got = c.run(b.first, b.n, b.large);
    size_t diff = 0;
    for (int64_t t = 0; t < b.n; ++t)
      diff += std::memcmp(&got[t * c.ldy], &all[(b.first + t) * c.ldy], static_cast<size_t>(rows) * 4) != 0;
    INFO("tokens " << b.first << ".." << b.first + b.n - 1 << (b.large ? " (tiled kernel)" : " (small-batch kernel)"));
    CHECK(diff == 0);
  }
}

}  // namespace

TEST_CASE("the tensor-core matmul's kernels give one token the same bits in any batch", "[kernels][cuda-emulation]") {
  std::mt19937 g(21);
  check_case<__nv_bfloat16>(40, 1050, g);  // slices 512 + 512 + 32: three warps busy
  check_case<__half>(17, 1050, g);
  check_case<__nv_bfloat16>(19, 4200, g);  // nine slices: two rounds of the small kernel
}
