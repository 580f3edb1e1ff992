// AVX2 + FMA + F16C kernels (machines without AVX-512 VNNI).
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
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

// One accumulator chain per (row, token), blocks in order, offsets summed in a scalar
// in order: the same arithmetic as GGML's AVX2 q4_1 x q8_1 / q8_0 x q8_0 dot products, so
// logits track llama.cpp's. Latency is hidden by computing kR rows x kNT tokens at once
// (independent chains); a (row, token) result never depends on the tile it is in.
template <RqLayout kL, int kR, int kNT>
void rq_tile(const uint8_t* w, size_t row_stride, int64_t np, const int8_t* xq, const float* xs, int64_t r, float* y,
             int64_t ldy) {
  constexpr bool kRQ4 = kL == RqLayout::Four;
  constexpr size_t kPair = kRQ4 ? kRQ4PairBytes : kRQ8PairBytes;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[kR][kNT];
  __m128 summs[kR][kNT];
  for (int i = 0; i < kR; ++i)
    for (int t = 0; t < kNT; ++t) {
      acc[i][t] = _mm256_setzero_ps();
      summs[i][t] = _mm_setzero_ps();
    }
  for (int64_t p = 0; p < np; ++p) {
    __m256i xa[kNT], xb[kNT];
    __m128 x4[kNT];
    for (int t = 0; t < kNT; ++t) {
      x4[t] = _mm_loadu_ps(xs + (t * np + p) * 4);
      xa[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * np + p) * 64));
      xb[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * np + p) * 64 + 32));
    }
    for (int i = 0; i < kR; ++i) {
      const uint8_t* pp = w + (r + i) * row_stride + p * kPair;
      const __m128 w4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pp)));
      __m256i wa, wb;
      if constexpr (kRQ4) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8));
        wa = _mm256_and_si256(v, m4);
        wb = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      } else if constexpr (kL == RqLayout::EightSmall) {  // u < 128: maddubs cannot saturate
        wa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8));
        wb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 40));
      } else {  // u - 128 as signed bytes
        wa = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8)), bias);
        wb = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 40)), bias);
      }
      for (int t = 0; t < kNT; ++t) {
        __m128 prod = _mm_mul_ps(w4, x4[t]);  // dA dxA, dB dxB, mA sA, mB sB
        __m256i ia, ib;
        if constexpr (kL != RqLayout::Eight) {
          ia = dot_u4(wa, xa[t], ones);
          ib = dot_u4(wb, xb[t], ones);
        } else {
          // sum((u - 128) x) = sum(q x) for Q8_0, whose offset term m s = -128 d s is then
          // exactly cancelled by the +128 d s this decomposition needs: both are skipped.
          ia = dot_s8(wa, xa[t], ones);
          ib = dot_s8(wb, xb[t], ones);
        }
        acc[i][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(prod), _mm256_cvtepi32_ps(ia), acc[i][t]);
        acc[i][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(prod)), _mm256_cvtepi32_ps(ib), acc[i][t]);
        if constexpr (kL != RqLayout::Eight) {
          const __m128 off = _mm_movehl_ps(prod, prod);
          summs[i][t] = _mm_add_ss(summs[i][t], off);
          summs[i][t] = _mm_add_ss(summs[i][t], _mm_movehdup_ps(off));
        }
      }
    }
  }
  for (int i = 0; i < kR; ++i)
    for (int t = 0; t < kNT; ++t) y[t * ldy + r + i] = hsum(acc[i][t]) + _mm_cvtss_f32(summs[i][t]);
}

template <RqLayout kRQ4, int kNT>
void rq_rows(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int64_t r0, int64_t r1,
             float* y, int64_t ldy) {
  constexpr int kR = 4 / kNT;
  int64_t r = r0;
  for (; r + kR <= r1; r += kR) {
    // A tile reads kR short rows in an interleaved order, which hardware prefetchers do not
    // follow; fetch the tile after next explicitly (prefetches never fault).
    const char* ahead = reinterpret_cast<const char*>(w + (r + 2 * kR) * rs);
    for (size_t o = 0; o < kR * rs; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
    rq_tile<kRQ4, kR, kNT>(w, rs, np, xq, xs, r, y, ldy);
  }
  for (; r < r1; ++r) rq_tile<kRQ4, 1, kNT>(w, rs, np, xq, xs, r, y, ldy);
}

template <RqLayout kRQ4>
void rq_dispatch(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt, int64_t r0,
                 int64_t r1, float* y, int64_t ldy) {
  switch (nt) {
    case 1:
      rq_rows<kRQ4, 1>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 2:
      rq_rows<kRQ4, 2>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 3:
      rq_rows<kRQ4, 3>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    default:
      rq_rows<kRQ4, 4>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
  }
}

void rq_avx2(RqLayout layout, const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt,
             int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (layout) {
    case RqLayout::Four:
      rq_dispatch<RqLayout::Four>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
      break;
    case RqLayout::EightSmall:
      rq_dispatch<RqLayout::EightSmall>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
      break;
    case RqLayout::Eight:
      rq_dispatch<RqLayout::Eight>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
      break;
  }
}

// Q6_K x Q8_K: 6-bit values (0..63) times int8 activations with maddubs (no saturation:
// 63 * 127 * 2 < 32767), scaled per 16-element group with madd, all in int32 per
// super-block; the -32 offset is removed with the activation's group sums.
void q6k_avx2(const uint8_t* w, size_t row_stride, int64_t nb, const BlockQ8_K* x, int nt, int64_t r0, int64_t r1,
              float* y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m3 = _mm256_set1_epi8(0x03);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w + r * row_stride);
    float acc[kMaxTile] = {};
    for (int64_t i = 0; i < nb; ++i) {
      const BlockQ6_K& b = blocks[i];
      __m256i u[8];
      for (int n = 0; n < 2; ++n) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * n));
        u[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
        u[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
        u[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
        u[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
      }
      __m256i scv[8];
      for (int c = 0; c < 8; ++c)
        scv[c] = _mm256_setr_m128i(_mm_set1_epi16(b.scales[2 * c]), _mm_set1_epi16(b.scales[2 * c + 1]));
      const float d = f16_to_f32(b.d);
      for (int t = 0; t < nt; ++t) {
        const BlockQ8_K& xb = x[t * nb + i];
        __m256i tot = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 32 * c));
          tot = _mm256_add_epi32(tot, _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], xv), scv[c]));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(tot), _mm256_extracti128_si256(tot, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        int32_t isum = _mm_cvtsi128_si32(s4);
        int32_t corr = 0;
        for (int g = 0; g < 16; ++g) corr += b.scales[g] * xb.bsums[g];
        isum -= 32 * corr;
        acc[t] = std::fma(d * xb.d, static_cast<float>(isum), acc[t]);  // one rounding in both ISAs' files
      }
    }
    for (int t = 0; t < nt; ++t) y[t * ldy + r] = acc[t];
  }
}

__m256 load8(PackKind kind, const uint8_t* row, int64_t k) {
  switch (kind) {
    case PackKind::F16:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
    case PackKind::BF16:
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k))), 16));
    default:
      return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
}

void flt_avx2(PackKind kind, const uint8_t* w, size_t row_stride, int64_t cols, const float* x, int nt, int64_t r0,
              int64_t r1, float* y, int64_t ldy) {
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
        if (kind == PackKind::F16) {
          uint16_t h;
          std::memcpy(&h, row + 2 * k, 2);
          wk = f16_to_f32(h);
        } else if (kind == PackKind::BF16) {
          uint16_t h;
          std::memcpy(&h, row + 2 * k, 2);
          wk = bf16_to_f32(h);
        } else
          std::memcpy(&wk, row + 4 * k, 4);
        s = std::fma(wk, x[t * cols + k], s);
      }
      y[t * ldy + r] = s;
    }
  }
}

}  // namespace

const MatmulKernels& avx2_kernels() {
  static const MatmulKernels k{rq_avx2, rq_avx2, kMaxTile, q6k_avx2, flt_avx2};
  return k;
}

}  // namespace troupe::cpu
