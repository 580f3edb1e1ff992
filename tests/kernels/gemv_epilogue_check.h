// Checks a GEMV's fused epilogues (kernels/cuda/gemv_epilogue.cuh) on the CPU: the fused
// kernel's outputs must be the plain kernel's row sums put through the op each epilogue
// replaces, computed here loop by loop (silu_mul, then rope + kv_write as in rope.cu), bit
// for bit, with nothing written outside its place. Include after the kernel's .cu file.
//   plain(float* y, int64_t rows): the plain kernel's sums of every weight row, y [n, rows]
//   fused(E out): the kernel with epilogue `out`
#pragma once
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace troupe::test {

inline uint32_t float_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
inline uint16_t f16_bits(float v) {
  const __half h = __float2half_rn(v);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

template <class Plain, class Fused>
void check_silu_epilogue(int64_t ffn, int64_t n, Plain plain, Fused fused) {
  std::vector<float> y(static_cast<size_t>(n * 2 * ffn), -5.0f);
  plain(y.data(), 2 * ffn);
  const int64_t ldo = ffn + 3;
  std::vector<float> out(static_cast<size_t>(n * ldo), -9.0f);
  fused(cuda::SiluOut{out.data(), ldo, ffn});
  int64_t bad = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < ffn; ++j) {
      const float want = cuda::silu_gate(y[t * 2 * ffn + j], y[t * 2 * ffn + ffn + j]);
      bad += float_bits(out[t * ldo + j]) != float_bits(want);
    }
    for (int64_t j = ffn; j < ldo; ++j) bad += out[t * ldo + j] != -9.0f;  // the stride's gap untouched
  }
  INFO("ffn " << ffn << " n " << n);
  CHECK(bad == 0);
}

template <class Plain, class Fused>
void check_rope_epilogue(int64_t nh, int64_t nkv, int64_t hd, int64_t n, bool neox, std::mt19937& g, Plain plain,
                         Fused fused) {
  const int64_t rows = (nh + 2 * nkv) * hd, ld = rows + 5, kv_row = nkv * hd, half = hd / 2;
  std::vector<float> y(static_cast<size_t>(n * rows), -5.0f);
  plain(y.data(), rows);
  std::uniform_real_distribution<float> angle(-3.0f, 3.0f);
  std::vector<float> cs(static_cast<size_t>(n * hd));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float a = angle(g);
      cs[t * hd + 2 * i] = std::cos(a);
      cs[t * hd + 2 * i + 1] = std::sin(a);
    }
  const int64_t num_slots = n + 4;  // distinct slots, shuffled, some left unused
  std::vector<int32_t> slots(static_cast<size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), g);
  slots.resize(static_cast<size_t>(n));
  std::vector<float> qkv(static_cast<size_t>(n * ld), -9.0f);
  std::vector<uint16_t> kc(static_cast<size_t>(num_slots * kv_row), 0xABCD), vc(kc.size(), 0xABCD);
  fused(cuda::RopeKvOut{
      cuda::RopeKvArgs{qkv.data(), ld, nh, nkv, hd, cs.data(), neox, slots.data(), kc.data(), vc.data()}});
  // The expected: the plain sums at stride ld, Q and K heads rotated in place, rotated K
  // and V in the token's slot as f16.
  std::vector<float> want(qkv.size(), -9.0f);
  std::vector<uint16_t> kw(kc.size(), 0xABCD), vw(vc.size(), 0xABCD);
  for (int64_t t = 0; t < n; ++t) {
    float* r = want.data() + t * ld;
    std::copy(y.begin() + t * rows, y.begin() + (t + 1) * rows, r);
    const float* c = cs.data() + t * hd;
    for (int64_t h = 0; h < nh + nkv; ++h)
      for (int64_t i = 0; i < half; ++i) {
        float* v = r + h * hd;
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float y0, y1;
        cuda::rope_rotate(v[a], v[b], c[2 * i], c[2 * i + 1], &y0, &y1);
        v[a] = y0;
        v[b] = y1;
      }
    const int64_t slot = slots[t];
    for (int64_t j = 0; j < kv_row; ++j) {
      kw[slot * kv_row + j] = f16_bits(r[nh * hd + j]);
      vw[slot * kv_row + j] = f16_bits(r[(nh + nkv) * hd + j]);
    }
  }
  int64_t bad = 0;
  for (size_t i = 0; i < qkv.size(); ++i) bad += float_bits(qkv[i]) != float_bits(want[i]);
  INFO("heads " << nh << "/" << nkv << " hd " << hd << " n " << n << " neox " << neox);
  CHECK(bad == 0);
  CHECK(kc == kw);
  CHECK(vc == vw);
}

}  // namespace troupe::test
