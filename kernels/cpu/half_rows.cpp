// Row helpers for the f16 KV cache and attention: F16C/FMA versions chosen at run time,
// portable fallbacks otherwise.
#include <immintrin.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
namespace {

// f32 -> f16, round to nearest even. Finite (the KV cache's conversion, fp16.h:
// f32_to_f16_kv): NaN lanes to 0 (the ordered compare is false only for NaN), then clamped
// to +-65504.
template <bool Finite>
__attribute__((target("avx2,fma,f16c"))) void f32_to_f16_avx2(const float* x, uint16_t* y, int64_t n) {
  const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if constexpr (Finite) v = _mm256_max_ps(_mm256_min_ps(_mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)), hi), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = Finite ? f32_to_f16_kv(x[i]) : f32_to_f16(x[i]);
}
__attribute__((target("avx2,fma,f16c"))) void f16_to_f32_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}
// One 8-lane accumulator, then a fixed horizontal sum.
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
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

bool use_simd() {
  static const bool v = detect_isa() != Isa::Scalar;
  return v;
}
}  // namespace

void f32_to_f16_row(const float* x, uint16_t* y, int64_t n) {
  if (use_simd()) return f32_to_f16_avx2<false>(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}
void f32_to_f16_kv_row(const float* x, uint16_t* y, int64_t n) {
  if (use_simd()) return f32_to_f16_avx2<true>(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16_kv(x[i]);
}
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

}  // namespace troupe::cpu
