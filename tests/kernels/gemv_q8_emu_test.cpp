// The int8-activation GEMV kernel's source (kernels/cuda/matmul_q8.cu), run on the CPU
// through tests/kernels/cuda_emulation.h: four rows per warp give one row per warp's bits,
// every token in a group of 2..8 gets what the one-token launch computes for it alone
// (batch invariance), and the values are the blocks' dot products (a double reference of the
// same formula) for every 32-block type and the K-quants.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/matmul_q8.cu"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "kernels/cpu/quant_ref.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/gemv_epilogue_check.h"

using namespace troupe;

namespace {

// Block b of token t's quantized activations, read from the split row (ops.h).
struct Q8 {
  int8_t q[32];
  float d, s;
};
Q8 q8_block(const std::vector<uint8_t>& xq, int64_t cols, int64_t t, int64_t b) {
  const int64_t nb = cols / 32;
  const uint8_t* row = xq.data() + t * cuda::q8_row_bytes(cols);
  Q8 o;
  std::memcpy(o.q, row + 16 * b, 16);
  std::memcpy(o.q + 16, row + 16 * (nb + b), 16);
  std::memcpy(&o.d, row + 4 * (8 * nb + b), 4);
  std::memcpy(&o.s, row + 4 * (9 * nb + b), 4);
  return o;
}

template <DType T, int NT, int R>
std::vector<float> run(const std::vector<uint8_t>& w, size_t row_bytes, int64_t rows, int64_t nb, const uint8_t* xq,
                       int64_t n) {
  std::vector<float> y(static_cast<size_t>(n * rows), -7.0f);
  const unsigned blocks = static_cast<unsigned>((rows + cuda::kWarpsPerBlock * R - 1) / (cuda::kWarpsPerBlock * R));
  const unsigned groups = static_cast<unsigned>((n + NT - 1) / NT);
  cuda_emu::launch3(blocks, groups, 1, cuda::kWarpsPerBlock * 32, cuda::gemv_q8_kernel<T, NT, R>, w.data(), row_bytes,
                    nb, xq, n, cuda::RowsOut{y.data(), rows, rows});
  return y;
}

template <DType T, int NT>
void check(std::mt19937& g, int64_t rows, int64_t nb, int64_t n) {
  const int64_t cols = nb * 32;
  const size_t src_rb = *row_bytes(T, static_cast<uint64_t>(cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // (random blocks for the K-quants, which have no quantizer here; rows in the device
  // layout)
  const std::vector<uint8_t> gguf = test::random_weight(T, rows, cols, g);
  size_t rb = 0;
  const std::vector<uint8_t> w = test::device_rows(T, gguf, rows, cols, &rb);
  // Activations quantized by the kernel that does it on the device.
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(g);
  const size_t xstride = cuda::q8_row_bytes(cols);
  std::vector<uint8_t> xq(static_cast<size_t>(n) * xstride, 0xEE);
  cuda_emu::launch(static_cast<unsigned>((n * nb + 7) / 8), 256, cuda::quantize_q8_kernel, x.data(), cols, cols, n,
                   cuda::q8_numerics(T), xq.data());
  for (int64_t i = 0; i < n * nb; ++i) {  // q = round(x / d) within a step of x's scale
    const Q8 b = q8_block(xq, cols, i / nb, i % nb);
    for (int j = 0; j < 32; ++j)
      REQUIRE(std::fabs(b.q[j] * b.d - x[i * 32 + j]) <= 0.6 * b.d + 1e-6);  // (d is f16-rounded)
  }
  const auto one = run<T, NT, 1>(w, rb, rows, nb, xq.data(), n);
  const auto four = run<T, NT, 4>(w, rb, rows, nb, xq.data(), n);
  CHECK(std::memcmp(one.data(), four.data(), one.size() * 4) == 0);
  for (int64_t t = 0; t < n; ++t) {
    const auto solo = run<T, 1, 4>(w, rb, rows, nb, xq.data() + t * xstride, 1);
    CHECK(std::memcmp(solo.data(), four.data() + t * rows, static_cast<size_t>(rows) * 4) == 0);
  }
  // The value: sum over blocks of d_w d_x isum + m_w s_x, from the dequantized weights.
  std::vector<float> deq(static_cast<size_t>(cols));
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    REQUIRE(cpu::dequantize_row_ref(T, gguf.data() + r * src_rb, deq.data(), cols));
    for (int64_t t = 0; t < n; ++t) {
      double ref = 0, scale = 1;
      for (int64_t b = 0; b < nb; ++b)
        for (int j = 0; j < 32; ++j) {
          const Q8 xb = q8_block(xq, cols, t, b);
          const double p = double(deq[b * 32 + j]) * xb.d * xb.q[j];
          ref += p;
          scale += std::fabs(p);
        }
      // (relative to the terms' size: the kernel's m_w s_x uses s_x as the quantizer stored
      // it, f16-rounded for Q4_1 and Q5_1)
      worst = std::max(worst, std::fabs(ref - four[t * rows + r]) / scale);
    }
  }
  CHECK(worst < 2e-3);
}

// Every block's unpacked integers, scales and offsets give the reference dequantizer's
// values: split device rows of odd block counts (so the high-bit and scale sections start
// at odd multiples of a block's share), K-quant rows of one and of three super-blocks.
template <DType T>
void check_unpack(std::mt19937& g, int64_t nb) {
  const int64_t rows = 3, cols = nb * 32;
  const size_t src_rb = *row_bytes(T, static_cast<uint64_t>(cols));
  const std::vector<uint8_t> gguf = test::random_weight(T, rows, cols, g);
  size_t rb = 0;
  const std::vector<uint8_t> w = test::device_rows(T, gguf, rows, cols, &rb);
  std::vector<float> deq(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    REQUIRE(cpu::dequantize_row_ref(T, gguf.data() + r * src_rb, deq.data(), cols));
    for (int64_t j = 0; j < nb; ++j) {
      int32_t v[8];
      float d, m;
      int sc[2] = {1, 1};
      cuda::unpack_block<T>(w.data() + r * rb, j, nb, v, &d, &m, sc);
      for (int e = 0; e < 32; ++e) {
        const int q = static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(v[e / 4]) >> (8 * (e % 4))));
        const int qu = static_cast<int>((static_cast<uint32_t>(v[e / 4]) >> (8 * (e % 4))) & 0xFF);
        const double got = T == DType::Q6_K   ? double(d) * sc[e / 16] * q
                           : T == DType::Q8_0 ? double(d) * q
                                              : double(d) * qu + m;
        const double want = deq[j * 32 + e];
        INFO(dtype_traits(T).name << " row " << r << " block " << j << " element " << e);
        REQUIRE(std::fabs(got - want) <= 1e-6 * (std::fabs(want) + std::fabs(double(m)) + std::fabs(double(d))));
      }
    }
  }
}

}  // namespace

TEST_CASE("the int8-activation GEMV's block unpacking gives the reference dequantizer's values",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(13);
  for (int64_t nb : {1, 7}) {
    check_unpack<DType::Q4_0>(g, nb);
    check_unpack<DType::Q4_1>(g, nb);
    check_unpack<DType::Q5_0>(g, nb);
    check_unpack<DType::Q5_1>(g, nb);
    check_unpack<DType::Q8_0>(g, nb);
  }
  for (int64_t nb : {8, 24}) {
    check_unpack<DType::Q4_K>(g, nb);
    check_unpack<DType::Q5_K>(g, nb);
    check_unpack<DType::Q6_K>(g, nb);
  }
}

TEST_CASE("the int8-activation GEMV kernel's source: rows per warp and batch never change a token's bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(12);
  for (int64_t rows : {5, 33}) {
    for (int64_t nb : {3, 20}) {
      INFO("rows " << rows << " blocks " << nb);
      check<DType::Q4_0, 4>(g, rows, nb, 3);
      check<DType::Q4_1, 8>(g, rows, nb, 11);
      check<DType::Q5_0, 2>(g, rows, nb, 2);
      check<DType::Q5_1, 8>(g, rows, nb, 7);
      check<DType::Q8_0, 4>(g, rows, nb, 4);
    }
    for (int64_t nb : {8, 24}) {  // K-quants: 256-value super-blocks of eight 32-value sub-blocks
      INFO("rows " << rows << " blocks " << nb);
      check<DType::Q4_K, 4>(g, rows, nb, 3);
      check<DType::Q5_K, 8>(g, rows, nb, 9);
      check<DType::Q6_K, 2>(g, rows, nb, 2);
      check<DType::Q6_K, 8>(g, rows, nb, 8);
    }
  }
}

namespace {

// The fused SiLU and RoPE + KV-write epilogues of the int8 GEMV (gemv_epilogue.cuh) against
// the plain kernel's sums put through silu_mul and rope + kv_write (gemv_epilogue_check.h).
template <DType T, int NT>
void check_epilogues(std::mt19937& g, int64_t nb, int64_t n) {
  const int64_t cols = nb * 32;
  size_t rb = *cuda::device_row_bytes(T, cols);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(g);
  std::vector<uint8_t> xq(static_cast<size_t>(n) * cuda::q8_row_bytes(cols));
  cuda_emu::launch(static_cast<unsigned>((n * nb + 7) / 8), 256, cuda::quantize_q8_kernel, x.data(), cols, cols, n,
                   cuda::q8_numerics(T), xq.data());
  auto weight = [&](int64_t rows) {
    return test::device_rows(T, test::random_weight(T, rows, cols, g), rows, cols, &rb);
  };
  const unsigned groups = static_cast<unsigned>((n + NT - 1) / NT);
  auto fused_launch = [&]<int R>(const std::vector<uint8_t>& w, auto out) {
    using E = decltype(out);
    const int64_t per_block = int64_t{cuda::kWarpsPerBlock} * (R / E::kRows);
    cuda_emu::launch3(static_cast<unsigned>((out.items() + per_block - 1) / per_block), groups, 1,
                      cuda::kWarpsPerBlock * 32, cuda::gemv_q8_kernel<T, NT, R, E>, w.data(), rb, nb,
                      static_cast<const uint8_t*>(xq.data()), n, out);
  };
  for (int64_t ffn : {5, 37}) {
    const auto w = weight(2 * ffn);
    auto plain = [&](float* y, int64_t rows) {
      const auto p = run<T, NT, 1>(w, rb, rows, nb, xq.data(), n);
      std::copy(p.begin(), p.end(), y);
    };
    test::check_silu_epilogue(ffn, n, plain, [&](cuda::SiluOut o) { fused_launch.template operator()<2>(w, o); });
    test::check_silu_epilogue(ffn, n, plain, [&](cuda::SiluOut o) { fused_launch.template operator()<4>(w, o); });
  }
  // SiluQ8Out: SiluOut's floats, and the down matmul's int8 activations as
  // quantize_q8_kernel makes them from those floats, by whichever block finishes each
  // 32-value block last; the counters are left zero, so a second launch does it again.
  for (int64_t ffn : {32, 96}) {
    const auto w = weight(2 * ffn);
    const int64_t ldo = ffn + 3, nbo = ffn / 32;
    const size_t orb = cuda::q8_row_bytes(ffn);
    std::vector<float> want(static_cast<size_t>(n * ldo), -9.0f);
    fused_launch.template operator()<2>(w, cuda::SiluOut{want.data(), ldo, ffn});
    std::vector<uint8_t> want_q(static_cast<size_t>(n) * orb, 0xEE);
    cuda_emu::launch(static_cast<unsigned>((n * nbo + 7) / 8), 256, cuda::quantize_q8_kernel,
                     static_cast<const float*>(want.data()), ldo, ffn, n, cuda::q8_numerics(T), want_q.data());
    auto fused_q8 = [&]<int R>() {
      INFO("ffn " << ffn << " n " << n << " rows a warp " << R);
      std::vector<float> out(want.size(), -9.0f);
      std::vector<uint8_t> q(want_q.size(), 0xEE);
      std::vector<unsigned> done(static_cast<size_t>(cuda::silu_q8_counters(n, ffn)), 0u);
      const cuda::SiluQ8Args qa{q.data(), cuda::q8_numerics(T), done.data()};
      for (int rep = 0; rep < 2; ++rep) {
        std::fill(q.begin(), q.end(), uint8_t{0xEE});
        fused_launch.template operator()<R>(w, cuda::SiluQ8Out{cuda::SiluOut{out.data(), ldo, ffn}, qa});
        CHECK(std::memcmp(out.data(), want.data(), out.size() * 4) == 0);
        CHECK(q == want_q);
        CHECK(std::all_of(done.begin(), done.end(), [](unsigned c) { return c == 0; }));
      }
    };
    fused_q8.template operator()<2>();
    fused_q8.template operator()<4>();
  }
  for (bool neox : {false, true}) {
    const int64_t nh = 3, nkv = 1, hd = 32;
    const auto w = weight((nh + 2 * nkv) * hd);
    auto plain = [&](float* y, int64_t rows) {
      const auto p = run<T, NT, 1>(w, rb, rows, nb, xq.data(), n);
      std::copy(p.begin(), p.end(), y);
    };
    test::check_rope_epilogue(nh, nkv, hd, n, neox, g, plain,
                              [&](cuda::RopeKvOut o) { fused_launch.template operator()<2>(w, o); });
  }
}

}  // namespace

TEST_CASE("the int8-activation GEMV's fused SiLU and RoPE + KV-write epilogues give the unfused ops' bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(14);
  check_epilogues<DType::Q4_1, 1>(g, 3, 1);
  check_epilogues<DType::Q4_0, 4>(g, 5, 3);
  check_epilogues<DType::Q8_0, 8>(g, 2, 11);
  check_epilogues<DType::Q6_K, 2>(g, 8, 2);
  check_epilogues<DType::Q4_K, 8>(g, 8, 9);
}

namespace {

// The tensor-core int8 matmul (gemm_q8_mma_kernel) against the GEMV, bit for bit, for every
// token: ragged 16-row tiles, 64-token blocks and 16-token warps, lane classes with zero to
// three blocks (so the pairwise tree of class sums meets empty classes and long ones).
template <DType T>
void check_mma(std::mt19937& g, int64_t rows, int64_t nb, int64_t n) {
  const int64_t cols = nb * 32;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  size_t rb = 0;
  const std::vector<uint8_t> w = test::device_rows(T, test::random_weight(T, rows, cols, g), rows, cols, &rb);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(g);
  std::vector<uint8_t> xq(static_cast<size_t>(n) * cuda::q8_row_bytes(cols));
  cuda_emu::launch(static_cast<unsigned>((n * nb + 7) / 8), 256, cuda::quantize_q8_kernel, x.data(), cols, cols, n,
                   cuda::q8_numerics(T), xq.data());
  const auto gemv = run<T, 8, 4>(w, rb, rows, nb, xq.data(), n);
  const int64_t ldy = rows + 3;
  std::vector<float> y(static_cast<size_t>(n * ldy), -7.0f);
  const int64_t per_block = cuda::kMmaWarps * cuda::kMmaTokens;
  cuda_emu::launch3(static_cast<unsigned>((rows + 15) / 16), static_cast<unsigned>((n + per_block - 1) / per_block), 1,
                    cuda::kMmaWarps * 32, cuda::gemm_q8_mma_kernel<T>, w.data(), rb, rows, nb,
                    static_cast<const uint8_t*>(xq.data()), n, y.data(), ldy);
  INFO(dtype_traits(T).name << " rows " << rows << " blocks " << nb << " tokens " << n);
  size_t differ = 0, outside = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r)
      if (std::memcmp(&y[t * ldy + r], &gemv[t * rows + r], 4) != 0) ++differ;
    for (int64_t r = rows; r < ldy; ++r)
      if (y[t * ldy + r] != -7.0f) ++outside;
  }
  CHECK(differ == 0);
  CHECK(outside == 0);
}

}  // namespace

TEST_CASE("the tensor-core int8 matmul gives every token the GEMV's bits", "[kernels][cuda-emulation]") {
  std::mt19937 g(15);
  for (int64_t rows : {5, 40}) {
    for (int64_t nb : {3, 70}) {
      check_mma<DType::Q4_0>(g, rows, nb, 70);
      check_mma<DType::Q4_1>(g, rows, nb, 21);
      check_mma<DType::Q5_0>(g, rows, nb, 9);
      check_mma<DType::Q5_1>(g, rows, nb, 16);
      check_mma<DType::Q8_0>(g, rows, nb, 70);
    }
    for (int64_t nb : {8, 72}) {
      check_mma<DType::Q4_K>(g, rows, nb, 17);
      check_mma<DType::Q5_K>(g, rows, nb, 5);
      check_mma<DType::Q6_K>(g, rows, nb, 70);
    }
  }
}
