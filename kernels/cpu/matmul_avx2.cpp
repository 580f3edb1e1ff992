// AVX2 + FMA + F16C kernels (machines without AVX-512 VNNI).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
const MatmulKernels& scalar_kernels();
namespace {

inline __m256i dot_u4(__m256i w, __m256i x, __m256i ones) {  // w in 0..15: no saturation
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
}
inline __m256i dot_s8(__m256i ws, __m256i x, __m256i ones) {  // signed w via the sign trick
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(x, ws)), ones);
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Four independent accumulators per token (blocks A/B of even/odd pairs) hide the FMA
// latency at one token; tiles hold at most two tokens to stay within 16 registers. The
// per-token operation sequence is the same for every tile size (batch independence).
template <bool kRQ4, int kNT>
void rq_rows(const uint8_t* w, size_t row_stride, int64_t np, const int8_t* xq, const float* xs,
             int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr size_t kPair = kRQ4 ? kRQ4PairBytes : kRQ8PairBytes;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_stride;
    __m256 acc[kNT][4];
    __m128 accm[kNT];
    for (int t = 0; t < kNT; ++t) {
      for (auto& a : acc[t]) a = _mm256_setzero_ps();
      accm[t] = _mm_setzero_ps();
    }
    // Pairs alternate between accumulator sets {0,1} and {2,3} (constant indices keep
    // the accumulators in registers).
    auto step = [&](int64_t p, auto e_const) {
      constexpr int e = decltype(e_const)::value;
      const uint8_t* pp = row + p * kPair;
      const __m128 w4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pp)));
      __m256i wa, wb;
      if constexpr (kRQ4) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8));
        wa = _mm256_and_si256(v, m4);
        wb = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      } else {  // u - 128 as signed bytes
        wa = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8)), bias);
        wb = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 40)), bias);
      }
      for (int t = 0; t < kNT; ++t) {
        const __m128 x4 = _mm_loadu_ps(xs + (t * np + p) * 4);
        __m128 prod = _mm_mul_ps(w4, x4);  // dA dxA, dB dxB, mA sA, mB sB
        const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * np + p) * 64));
        const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * np + p) * 64 + 32));
        __m256i ia, ib;
        if constexpr (kRQ4) {
          ia = dot_u4(wa, xa, ones);
          ib = dot_u4(wb, xb, ones);
          accm[t] = _mm_add_ps(accm[t], prod);
        } else {
          ia = dot_s8(wa, xa, ones);
          ib = dot_s8(wb, xb, ones);
          // sum((u - 128) x) was computed: add back 128 * d * s per block into the m lanes.
          const __m128 corr = _mm_mul_ps(_mm_mul_ps(w4, _mm_movehl_ps(x4, x4)), _mm_set1_ps(128.0f));
          accm[t] = _mm_add_ps(accm[t], _mm_add_ps(prod, _mm_movelh_ps(_mm_setzero_ps(), corr)));
        }
        const __m256 sa = _mm256_broadcastss_ps(prod);
        const __m256 sb = _mm256_broadcastss_ps(_mm_movehdup_ps(prod));
        acc[t][e] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), sa, acc[t][e]);
        acc[t][e + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib), sb, acc[t][e + 1]);
      }
    };
    int64_t p = 0;
    for (; p + 1 < np; p += 2) {
      step(p, std::integral_constant<int, 0>{});
      step(p + 1, std::integral_constant<int, 2>{});
    }
    if (p < np) step(p, std::integral_constant<int, 0>{});
    for (int t = 0; t < kNT; ++t) {
      alignas(16) float m[4];
      _mm_store_ps(m, accm[t]);
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3]));
      y[t * ldy + r] = hsum(sum) + (m[2] + m[3]);
    }
  }
}

template <bool kRQ4>
void rq_dispatch(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt,
                 int64_t r0, int64_t r1, float* y, int64_t ldy) {
  for (int t = 0; t < nt; t += 2) {
    if (nt - t >= 2) rq_rows<kRQ4, 2>(w, rs, np, xq + t * np * 64, xs + t * np * 4, r0, r1, y + t * ldy, ldy);
    else rq_rows<kRQ4, 1>(w, rs, np, xq + t * np * 64, xs + t * np * 4, r0, r1, y + t * ldy, ldy);
  }
}

void rq_avx2(bool is_rq4, const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt,
             int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (is_rq4) rq_dispatch<true>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
  else rq_dispatch<false>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
}

__m256 load8(PackKind kind, const uint8_t* row, int64_t k) {
  switch (kind) {
    case PackKind::F16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
    case PackKind::BF16:
      return _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k))), 16));
    default:
      return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
}

void flt_avx2(PackKind kind, const uint8_t* w, size_t row_stride, int64_t cols, const float* x, int nt,
              int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t main = cols / 8 * 8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_stride;
    __m256 acc[kMaxTile];
    for (int t = 0; t < nt; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t k = 0; k < main; k += 8) {
      const __m256 wv = load8(kind, row, k);
      for (int t = 0; t < nt; ++t) acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * cols + k), acc[t]);
    }
    for (int t = 0; t < nt; ++t) {
      float s = hsum(acc[t]);
      for (int64_t k = main; k < cols; ++k) {
        float wk;
        if (kind == PackKind::F16) { uint16_t h; std::memcpy(&h, row + 2 * k, 2); wk = f16_to_f32(h); }
        else if (kind == PackKind::BF16) { uint16_t h; std::memcpy(&h, row + 2 * k, 2); wk = bf16_to_f32(h); }
        else std::memcpy(&wk, row + 4 * k, 4);
        s += wk * x[t * cols + k];
      }
      y[t * ldy + r] = s;
    }
  }
}

}  // namespace

const MatmulKernels& avx2_kernels() {
  static const MatmulKernels k{rq_avx2, scalar_kernels().q6k, flt_avx2};
  return k;
}

}  // namespace troupe::cpu
