// The CUDA element-wise kernels' source (kernels/cuda/elementwise.cu: SiLU-gate, residual
// add, bias add, row gather, f32 -> f16/bf16), run on the CPU through
// tests/kernels/cuda_emulation.h with grids smaller than the data (so the grid-stride loops
// wrap), against the CPU backend and exact conversions.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/elementwise.cu"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "kernels/backend.h"
#include "kernels/fp16.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;

TEST_CASE("the CUDA element-wise kernels' source matches the CPU backend", "[kernels][cuda-emulation]") {
  std::mt19937 g(14);
  auto cpu = make_cpu_backend({1});
  const int64_t n = 5, ffn = 301, dim = 37, ld = 45;
  // Three blocks of 64 threads for hundreds of elements: every thread strides.
  const auto gu = test::random_floats(static_cast<size_t>(n * 2 * ffn), g, 4.0f);
  std::vector<float> act(static_cast<size_t>(n * ffn)), act_cpu(act.size());
  cuda_emu::launch(3, 64, cuda::silu_mul_kernel, gu.data(), n, ffn, act.data(), cuda::HalfOut{});
  cpu->silu_mul(gu.data(), n, ffn, act_cpu.data());
  for (size_t i = 0; i < act.size(); ++i)
    CHECK(std::fabs(act[i] - act_cpu[i]) <= 1e-6f + 1e-5f * std::fabs(act_cpu[i]));
  // With its output also in half for cuBLAS: the same f32 bits, and every half value as
  // to_half_rows rounds it (below: the host converters' bits).
  for (bool bf16 : {false, true}) {
    std::vector<float> act2(act.size());
    std::vector<uint16_t> h(act.size(), 0xEEEE);
    cuda_emu::launch(3, 64, cuda::silu_mul_kernel, gu.data(), n, ffn, act2.data(), cuda::HalfOut{h.data(), bf16});
    CHECK(std::memcmp(act2.data(), act.data(), act.size() * 4) == 0);
    size_t wrong = 0;
    for (size_t i = 0; i < h.size(); ++i) wrong += h[i] != (bf16 ? f32_to_bf16(act[i]) : f32_to_f16(act[i]));
    CHECK(wrong == 0);
  }

  auto x = test::random_floats(static_cast<size_t>(n * ld), g), y = test::random_floats(x.size(), g);
  auto bias = test::random_floats(static_cast<size_t>(dim), g);
  auto xg = x, xc = x;
  cuda_emu::launch(2, 64, cuda::add_kernel, xg.data(), static_cast<const float*>(y.data()), n * ld);
  cuda_emu::launch(2, 64, cuda::add_bias_kernel, xg.data(), int64_t{ld}, static_cast<const float*>(bias.data()), n,
                   int64_t{dim});
  cpu->add(xc.data(), y.data(), n * ld);
  cpu->add_bias(xc.data(), ld, bias.data(), n, dim);
  CHECK(std::memcmp(xg.data(), xc.data(), xg.size() * 4) == 0);  // exact: the same additions

  const std::vector<int32_t> rows = {4, 0, 4, 2};
  std::vector<float> gat(rows.size() * ld), gat_cpu(gat.size());
  cuda_emu::launch(static_cast<unsigned>(rows.size()), 32, cuda::gather_kernel, static_cast<const float*>(xg.data()),
                   int64_t{ld}, rows.data(), gat.data());
  cpu->gather_rows(xg.data(), ld, rows.data(), static_cast<int64_t>(rows.size()), gat_cpu.data());
  CHECK(std::memcmp(gat.data(), gat_cpu.data(), gat.size() * 4) == 0);

  // The MoE combine: out[t] = sum_j w[t, j] y[src[t, j]] in slot order, the host loop's bits.
  {
    const int64_t ny = 7, nt = 3;
    const int32_t k = 3;
    auto yv = test::random_floats(static_cast<size_t>(ny * dim), g);
    const std::vector<int32_t> src = {6, 0, 3, 1, 1, 5, 2, 4, 0};
    const std::vector<float> w = {0.5f, 0.25f, -1.5f, 0.7f, 0.1f, 1.0f, 0.0f, 2.0f, 0.3f};
    std::vector<int32_t> meta(src);
    for (float f : w) {
      int32_t bits;
      std::memcpy(&bits, &f, 4);
      meta.push_back(bits);
    }
    std::vector<float> og(static_cast<size_t>(nt * dim)), oc(og.size());
    cuda_emu::launch(static_cast<unsigned>(nt), 32, cuda::moe_combine_kernel, static_cast<const float*>(yv.data()),
                     int64_t{dim}, static_cast<const int32_t*>(meta.data()), nt, k, og.data());
    moe_combine_host(yv.data(), dim, src.data(), w.data(), nt, k, oc.data());
    CHECK(std::memcmp(og.data(), oc.data(), og.size() * 4) == 0);
  }

  // f32 -> f16/bf16 rows, zero-padded past cols and n: exactly the host converters, the
  // four-wide kernel the same bits as the scalar one.
  for (const bool vec : {false, true}) {
    const int64_t rn = 5, cols = vec ? 44 : 37, ldx = vec ? 48 : 45, ld_out = vec ? 52 : 41, n_pad = 8;
    std::vector<__half> h(static_cast<size_t>(n_pad * ld_out));
    std::vector<__nv_bfloat16> b(h.size());
    std::fill(h.begin(), h.end(), __float2half_rn(-9.0f));
    std::fill(b.begin(), b.end(), __float2bfloat16_rn(-9.0f));
    auto xa = test::random_floats(static_cast<size_t>(rn * ldx), g, 3.0f);  // (16-byte aligned storage)
    xa[1] = 70000.0f;                                                       // beyond f16: +inf there
    xa[2] = -1e-6f;                                                         // an f16 subnormal
    xa[3] = 1.00048828125f;                                                 // halfway between two f16 values: to even
    if (vec) {
      cuda_emu::launch(2, 64, cuda::to_half_rows_kernel<__half, true>, static_cast<const float*>(xa.data()), ldx, rn,
                       cols, ld_out, n_pad, h.data());
      cuda_emu::launch(2, 64, cuda::to_half_rows_kernel<__nv_bfloat16, true>, static_cast<const float*>(xa.data()), ldx,
                       rn, cols, ld_out, n_pad, b.data());
    } else {
      cuda_emu::launch(2, 64, cuda::to_half_rows_kernel<__half, false>, static_cast<const float*>(xa.data()), ldx, rn,
                       cols, ld_out, n_pad, h.data());
      cuda_emu::launch(2, 64, cuda::to_half_rows_kernel<__nv_bfloat16, false>, static_cast<const float*>(xa.data()),
                       ldx, rn, cols, ld_out, n_pad, b.data());
    }
    for (int64_t t = 0; t < n_pad; ++t)
      for (int64_t k = 0; k < ld_out; ++k) {
        const float v = t < rn && k < cols ? xa[t * ldx + k] : 0.0f;
        uint16_t hb, bb;
        std::memcpy(&hb, &h[t * ld_out + k], 2);
        std::memcpy(&bb, &b[t * ld_out + k], 2);
        INFO("vec " << vec << " t " << t << " k " << k);
        CHECK(hb == f32_to_f16(v));  // round to nearest even, as the host converters
        CHECK(bb == f32_to_bf16(v));
      }
  }
}
