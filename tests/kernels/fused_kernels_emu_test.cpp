// The fused CUDA kernels' own source (add_rms_norm in kernels/cuda/rms_norm.cu, the norms'
// int8 quantization of their output, rope_kv_write in kernels/cuda/rope.cu), run on the CPU through tests/kernels/cuda_emulation.h
// against the unfused kernels' source run the same way (the same bits: the same elements
// in the same threads and order) and against the CPU backend (within float tolerance).
// On a GPU, tests/kernels/cuda_ops_test.cpp checks the compiled kernels the same way.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel sources use)
#include "kernels/cuda/kv_write.cu"
#include "kernels/cuda/matmul_q8.cu"
#include "kernels/cuda/rms_norm.cu"
#include "kernels/cuda/rope.cu"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/fp16.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

}  // namespace

TEST_CASE("the fused add+RMSNorm kernel's source, run on the CPU, gives add + rms_norm's bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 rng(3);
  auto cpu = make_cpu_backend({1});
  for (int64_t dim : {7, 576, 2050}) {
    const int64_t n = 3;
    const auto x0 = test::random_floats(static_cast<size_t>(n * dim), rng, 3.0f);
    const auto y0 = test::random_floats(static_cast<size_t>(n * dim), rng, 2.0f);
    const auto w = test::random_floats(static_cast<size_t>(dim), rng);
    // Fused, with out aliasing y as the model calls it.
    auto xf = x0, yf = y0;
    cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::add_rms_norm_kernel, xf.data(), yf.data(),
                     w.data(), 1e-5f, dim, yf.data(), nullptr, cuda::Q8Numerics{}, cuda::HalfOut{});
    // Unfused: the element-wise add, then the norm kernel.
    auto xu = x0;
    for (size_t i = 0; i < xu.size(); ++i) xu[i] += y0[i];
    std::vector<float> outu(xu.size());
    cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::rms_norm_kernel, xu.data(), w.data(), 1e-5f, dim,
                     outu.data(), nullptr, cuda::Q8Numerics{}, cuda::HalfOut{});
    CHECK(same_bits(xf, xu));
    CHECK(same_bits(yf, outu));
    // The CPU backend's add_rms_norm.
    auto xc = x0, yc = y0;
    float* pw = cpu->upload(w);
    cpu->add_rms_norm(xc.data(), yc.data(), pw, 1e-5f, n, dim, yc.data());
    CHECK(same_bits(xc, xf));
    CHECK(max_diff(yc, yf) <= 1e-4);
  }
}

TEST_CASE("the norms' kernels, quantizing their output, give quantize_q8's bytes", "[kernels][cuda-emulation]") {
  std::mt19937 rng(5);
  // 576: SmolLM2's width (the last 256-thread pass has two warps of values); 2080: not a
  // multiple of 256; 64: fewer values than threads.
  for (int64_t dim : {576, 2080, 64}) {
    const int64_t n = 3;
    const size_t rb = cuda::q8_row_bytes(dim);
    auto x0 = test::random_floats(static_cast<size_t>(n * dim), rng, 3.0f);
    std::fill(x0.begin() + 32, x0.begin() + 64, 0.0f);  // a zero block (amax 0) of the plain norm
    const auto y0 = test::random_floats(static_cast<size_t>(n * dim), rng, 2.0f);
    const auto w = test::random_floats(static_cast<size_t>(dim), rng);
    for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q6_K}) {
      const cuda::Q8Numerics nq = cuda::q8_numerics(type);
      for (bool add : {false, true}) {
        // Fused: the norm writes its output and its quantized form (xq pre-filled, so
        // bytes left unwritten would show; the row's padding is never written).
        auto xf = x0, yf = y0;
        std::vector<float> of(xf.size());
        std::vector<uint8_t> qf(static_cast<size_t>(n) * rb, 0xEE);
        if (add)
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::add_rms_norm_kernel, xf.data(), yf.data(),
                           w.data(), 1e-5f, dim, yf.data(), qf.data(), nq, cuda::HalfOut{});
        else
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::rms_norm_kernel,
                           static_cast<const float*>(xf.data()), w.data(), 1e-5f, dim, of.data(), qf.data(), nq,
                           cuda::HalfOut{});
        const auto& outf = add ? yf : of;
        // Unfused: the plain norm, then the quantizer kernel on its output.
        auto xu = x0, yu = y0;
        std::vector<float> ou(xu.size());
        if (add)
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::add_rms_norm_kernel, xu.data(), yu.data(),
                           w.data(), 1e-5f, dim, yu.data(), nullptr, cuda::Q8Numerics{}, cuda::HalfOut{});
        else
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::rms_norm_kernel,
                           static_cast<const float*>(xu.data()), w.data(), 1e-5f, dim, ou.data(), nullptr,
                           cuda::Q8Numerics{}, cuda::HalfOut{});
        const auto& outu = add ? yu : ou;
        std::vector<uint8_t> qu(qf.size(), 0xEE);
        const int64_t warps = n * (dim / 32);
        cuda_emu::launch(static_cast<unsigned>((warps + 7) / 8), 256, cuda::quantize_q8_kernel, outu.data(), dim, dim,
                         n, nq, qu.data());
        INFO("dim " << dim << ", " << dtype_traits(type).name << (add ? ", add_rms_norm" : ", rms_norm"));
        CHECK(same_bits(outf, outu));
        CHECK(same_bits(xf, xu));
        CHECK(qf == qu);
        // Every quant byte and scale was written (the plain row's zero block too).
        const size_t written = static_cast<size_t>(dim / 32) * 40;
        for (int64_t t = 0; t < n; ++t)
          CHECK(std::count(qf.begin() + t * rb, qf.begin() + t * rb + written, uint8_t{0xEE}) <
                static_cast<long>(written / 8));
      }
    }
  }
}

TEST_CASE("the norms' kernels, writing their output in half for cuBLAS, give to_half_rows' bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 rng(6);
  // 576 and 2080 as above; 7: a width no quantized GEMV takes (cuBLAS takes any).
  for (int64_t dim : {576, 2080, 7}) {
    const int64_t n = 3;
    auto x0 = test::random_floats(static_cast<size_t>(n * dim), rng, 3.0f);
    const auto y0 = test::random_floats(static_cast<size_t>(n * dim), rng, 2.0f);
    const auto w = test::random_floats(static_cast<size_t>(dim), rng);
    for (bool bf16 : {false, true})
      for (bool add : {false, true}) {
        // The half copy pre-filled, so an element left unwritten would show.
        std::vector<uint16_t> h(static_cast<size_t>(n * dim), 0xEEEE);
        const cuda::HalfOut xh{h.data(), bf16};
        auto xf = x0, yf = y0, xu = x0, yu = y0;
        std::vector<float> of(xf.size()), ou(xf.size());
        if (add) {
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::add_rms_norm_kernel, xf.data(), yf.data(),
                           w.data(), 1e-5f, dim, yf.data(), nullptr, cuda::Q8Numerics{}, xh);
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::add_rms_norm_kernel, xu.data(), yu.data(),
                           w.data(), 1e-5f, dim, yu.data(), nullptr, cuda::Q8Numerics{}, cuda::HalfOut{});
        } else {
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::rms_norm_kernel,
                           static_cast<const float*>(xf.data()), w.data(), 1e-5f, dim, of.data(), nullptr,
                           cuda::Q8Numerics{}, xh);
          cuda_emu::launch(static_cast<unsigned>(n), cuda::kThreads, cuda::rms_norm_kernel,
                           static_cast<const float*>(xu.data()), w.data(), 1e-5f, dim, ou.data(), nullptr,
                           cuda::Q8Numerics{}, cuda::HalfOut{});
        }
        const auto& outf = add ? yf : of;
        INFO("dim " << dim << (bf16 ? ", bf16" : ", f16") << (add ? ", add_rms_norm" : ", rms_norm"));
        CHECK(same_bits(outf, add ? yu : ou));  // the f32 output as without the copy
        CHECK(same_bits(xf, xu));
        size_t wrong = 0;
        for (size_t i = 0; i < h.size(); ++i) wrong += h[i] != (bf16 ? f32_to_bf16(outf[i]) : f32_to_f16(outf[i]));
        CHECK(wrong == 0);
      }
  }
}

TEST_CASE("the fused RoPE+KV-write kernel's source, run on the CPU, gives rope + kv_write's bits",
          "[kernels][cuda-emulation]") {
  std::mt19937 rng(4);
  for (bool neox : {false, true}) {
    const int64_t nh = 6, nkv = 2, hd = 64, n = 4, ld = (nh + 2 * nkv) * hd + 5, row = nkv * hd;
    const std::vector<int32_t> slots = {9, 3, 30, 17};
    const int64_t num_slots = 32;
    const auto qkv0 = test::random_floats(static_cast<size_t>(n * ld), rng);
    std::vector<float> cs(static_cast<size_t>(n * hd));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < hd / 2; ++i) {
        cs[t * hd + 2 * i] = std::cos(0.37f * (t + 1) * (i + 1));
        cs[t * hd + 2 * i + 1] = std::sin(0.37f * (t + 1) * (i + 1));
      }
    auto qf = qkv0;
    std::vector<__half> kf(static_cast<size_t>(num_slots * row)), vf(kf.size());
    cuda_emu::launch(static_cast<unsigned>(n), 256, cuda::rope_kv_write_kernel, qf.data(), ld, nh, nkv, hd, cs.data(),
                     neox, slots.data(), kf.data(), vf.data());
    auto qu = qkv0;
    std::vector<__half> ku(kf.size()), vu(kf.size());
    cuda_emu::launch(static_cast<unsigned>(n), 256, cuda::rope_kernel, qu.data(), ld, nh, hd, cs.data(), neox);
    cuda_emu::launch(static_cast<unsigned>(n), 256, cuda::rope_kernel, qu.data() + nh * hd, ld, nkv, hd, cs.data(),
                     neox);
    cuda_emu::launch(static_cast<unsigned>(n), 128, cuda::kv_write_kernel, slots.data(), qu.data() + nh * hd,
                     qu.data() + (nh + nkv) * hd, ld, row, ku.data(), vu.data());
    CHECK(same_bits(qf, qu));
    CHECK(std::memcmp(kf.data(), ku.data(), kf.size() * 2) == 0);
    CHECK(std::memcmp(vf.data(), vu.data(), vf.size() * 2) == 0);
    // The written slots hold the rotated K (f16) and V; the others stay zero.
    int nonzero = 0;
    for (size_t i = 0; i < kf.size(); ++i) nonzero += __half2float(kf[i]) != 0.0f;
    CHECK(nonzero > static_cast<int>(n * row) * 9 / 10);
    CHECK(nonzero <= static_cast<int>(n * row));
    // The CPU backend's rope on the same rows.
    auto cpu = make_cpu_backend({1});
    auto qc = qkv0;
    const RopeKind kind = neox ? RopeKind::Neox : RopeKind::Interleaved;
    cpu->rope(qc.data(), ld, n, nh, hd, cs.data(), kind);
    cpu->rope(qc.data() + nh * hd, ld, n, nkv, hd, cs.data(), kind);
    CHECK(max_diff(qc, qf) <= 1e-5);
  }
}

TEST_CASE("the KV-write kernels' source stores no Inf or NaN: the CPU backend's finite f16",
          "[kernels][cuda-emulation]") {
  // K and V rows holding NaN, +-Inf and values beyond the f16 range among ordinary ones:
  // kv_write and rope_kv_write store what the CPU backend's kv_write stores (NaN as 0, the
  // rest saturated to +-65504), so no masked key's zero weight meets Inf or NaN in P V.
  std::mt19937 rng(5);
  const int64_t nh = 3, nkv = 1, hd = 32, n = 3, ld = (nh + 2 * nkv) * hd, row = nkv * hd;
  const std::vector<int32_t> slots = {2, 0, 5};
  auto qkv = test::random_floats(static_cast<size_t>(n * ld), rng, 100.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float extremes[] = {std::nanf(""), inf, -inf, 1e6f, -1e6f, 65520.0f};
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < 2 * row; j += 5) qkv[t * ld + nh * hd + j] = extremes[(t + j) % 6];
  std::vector<__half> kw(static_cast<size_t>(8 * row)), vw(kw.size());
  cuda_emu::launch(static_cast<unsigned>(n), 128, cuda::kv_write_kernel, slots.data(), qkv.data() + nh * hd,
                   qkv.data() + (nh + nkv) * hd, ld, row, kw.data(), vw.data());
  std::vector<uint16_t> want(static_cast<size_t>(row));
  int wrong = 0, nonfinite = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int kv = 0; kv < 2; ++kv) {
      cpu::f32_to_f16_kv_row(qkv.data() + t * ld + (nh + kv * nkv) * hd, want.data(), row);
      const auto& c = kv == 0 ? kw : vw;
      wrong += std::memcmp(c.data() + slots[t] * row, want.data(), row * 2) != 0;
    }
  for (const auto* c : {&kw, &vw})
    for (const __half h : *c) nonfinite += !std::isfinite(__half2float(h));
  CHECK(wrong == 0);
  CHECK(nonfinite == 0);
  // The fused RoPE + KV write (the cos/sin of angle 0 leave K as it was): the same cache.
  std::vector<float> cs(static_cast<size_t>(n * hd));
  for (int64_t i = 0; i < n * hd; i += 2) cs[i] = 1.0f;
  std::vector<__half> kf(kw.size()), vf(kw.size());
  auto qf = qkv;
  cuda_emu::launch(static_cast<unsigned>(n), 256, cuda::rope_kv_write_kernel, qf.data(), ld, nh, nkv, hd, cs.data(),
                   false, slots.data(), kf.data(), vf.data());
  nonfinite = 0;
  for (const auto* c : {&kf, &vf})
    for (const __half h : *c) nonfinite += !std::isfinite(__half2float(h));
  CHECK(nonfinite == 0);
  CHECK(std::memcmp(vf.data(), vw.data(), vw.size() * 2) == 0);
}
