#include "kernels/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
namespace {

__attribute__((target("avx2,fma,f16c"))) void f16_to_f32_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}
// Same accumulation order as dot_f16_f32 (one 8-lane accumulator, then a fixed hsum).
__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}
__attribute__((target("avx2,fma,f16c"))) void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}
bool use_simd() {
  static const bool v = detect_isa() != Isa::Scalar;
  return v;
}

}  // namespace

void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  if (use_simd()) return f16_to_f32_avx2(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}
float dot_f32(const float* a, const float* b, int64_t n) {
  if (use_simd()) return dot_avx2(a, b, n);
  float r = 0;
  for (int64_t i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}
void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
  if (use_simd()) return axpy_avx2(alpha, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void attention_tile(const AttentionTile& a) {
  thread_local std::vector<float> qr, scores, row;
  thread_local std::vector<uint16_t> qh;
  const int32_t hd = a.head_dim, G = a.group, nq = a.num * G;
  int32_t len = 0;
  for (int32_t i = 0; i < a.num; ++i) len = std::max(len, a.positions[i] + 1);
  // Queries rounded to f16 like the f16 keys they meet (as GGML does).
  qh.resize(static_cast<size_t>(nq) * hd);
  qr.resize(static_cast<size_t>(nq) * hd);
  for (int32_t i = 0; i < a.num; ++i)
    f32_to_f16_row(a.q + i * a.ld_q + int64_t{a.kv_head} * G * hd, qh.data() + int64_t{i} * G * hd, int64_t{G} * hd);
  f16_to_f32_row(qh.data(), qr.data(), static_cast<int64_t>(qr.size()));
  scores.resize(static_cast<size_t>(nq) * len);
  row.resize(static_cast<size_t>(hd));
  auto slot_of = [&](int32_t p) { return static_cast<int64_t>(a.block_table[p / a.block_size]) * a.block_size + p % a.block_size; };
  for (int32_t p = 0; p < len; ++p) {
    f16_to_f32_row(a.k + slot_of(p) * a.row + int64_t{a.kv_head} * hd, row.data(), hd);
    for (int32_t i = 0; i < a.num; ++i) {
      if (p > a.positions[i]) continue;
      for (int32_t g = 0; g < G; ++g)
        scores[static_cast<size_t>(i * G + g) * len + p] = dot_f32(row.data(), qr.data() + (int64_t{i} * G + g) * hd, hd) * a.scale;
    }
  }
  for (int32_t i = 0; i < a.num; ++i) {
    const int32_t n = a.positions[i] + 1;
    for (int32_t g = 0; g < G; ++g) {
      float* sc = scores.data() + static_cast<size_t>(i * G + g) * len;
      float mx = -std::numeric_limits<float>::infinity();
      for (int32_t p = 0; p < n; ++p) mx = std::max(mx, sc[p]);
      double sum = 0;
      for (int32_t p = 0; p < n; ++p) { sc[p] = std::exp(sc[p] - mx); sum += sc[p]; }
      const float inv = static_cast<float>(1.0 / sum);
      // Weights rounded to f16 like the f16 values they scale (as GGML does).
      for (int32_t p = 0; p < n; ++p) sc[p] *= inv;
      qh.resize(std::max(qh.size(), static_cast<size_t>(n)));
      f32_to_f16_row(sc, qh.data(), n);
      f16_to_f32_row(qh.data(), sc, n);
      std::fill_n(a.out + i * a.ld_out + (int64_t{a.kv_head} * G + g) * hd, hd, 0.0f);
    }
  }
  for (int32_t p = 0; p < len; ++p) {
    f16_to_f32_row(a.v + slot_of(p) * a.row + int64_t{a.kv_head} * hd, row.data(), hd);
    for (int32_t i = 0; i < a.num; ++i) {
      if (p > a.positions[i]) continue;
      for (int32_t g = 0; g < G; ++g)
        axpy_f32(scores[static_cast<size_t>(i * G + g) * len + p], row.data(),
                 a.out + i * a.ld_out + (int64_t{a.kv_head} * G + g) * hd, hd);
    }
  }
}

}  // namespace troupe::cpu
