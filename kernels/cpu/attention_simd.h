// AVX helpers shared by the attention bodies (attention_avx2.cpp, attention_avx512.cpp).
// Internal linkage on purpose: each file is compiled with its own ISA flags, so an inline
// function with external linkage could be merged by the linker into the other file's code.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "kernels/cpu/attention.h"

namespace troupe::cpu::simd {
namespace {

// Keys ahead whose K (V) rows are prefetched, into L2: a tile's rows sit 16 to a block,
// blocks scattered over the pool, and the hardware prefetchers hardly train on 16 strided
// rows (a serving step's cache is far out of the CPU caches: troupe_attention_bench's cold
// pass). Into L1 (_MM_HINT_T0) filled the miss buffers and ran at half the speed.
constexpr int32_t kAhead = 32;

inline void prefetch_l2(const uint16_t* p, int32_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int32_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T1);
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// In-place 8x8 transpose of r[0..7].
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// After transpose8 of eight keys' accumulators (acc[l] = lane l of each key): dot_f32's
// reduction ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) for the eight keys at once.
inline __m256 reduce8_lanes(const __m256 acc[8]) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                       _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
}

// The largest of s[0..n), eight lanes at a time: max is exact, so the lane order cannot change
// it (maxps keeps the running value on a NaN score, as std::max(mx, x) does).
inline float row_max(const float* s, int32_t n) {
  __m256 vmx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int32_t p = 0;
  for (; p + 8 <= n; p += 8) vmx = _mm256_max_ps(_mm256_loadu_ps(s + p), vmx);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmx);
  float mx = lanes[0];
  for (int l = 1; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;  // std::max(mx, lanes[l])
  for (; p < n; ++p) mx = s[p] > mx ? s[p] : mx;
  return mx;
}

// Bytes of each cache row to prefetch for tile a: prefetch_heads KV heads' parts from
// a.kv_head on, at least its own, never past the row's end.
inline int32_t prefetch_bytes(const AttentionTile& a) {
  const int64_t heads_left = a.row / a.head_dim - a.kv_head;
  const int64_t n = a.prefetch_heads < 1 ? 1 : a.prefetch_heads > heads_left ? heads_left : a.prefetch_heads;
  return static_cast<int32_t>(n * a.head_dim * 2);
}

}  // namespace
}  // namespace troupe::cpu::simd
