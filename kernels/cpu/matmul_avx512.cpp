// AVX-512 (F/BW/VL/VNNI) kernels: u8 x s8 dot products with vpdpbusd.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
namespace {

template <bool kRQ4, int kNT>
void rq_rows(const uint8_t* w, size_t row_stride, int64_t np, const int8_t* xq, const float* xs,
             int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr size_t kPair = kRQ4 ? kRQ4PairBytes : kRQ8PairBytes;
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_stride;
    __m512 acc[kNT];
    __m128 accm[kNT];
    for (int t = 0; t < kNT; ++t) { acc[t] = _mm512_setzero_ps(); accm[t] = _mm_setzero_ps(); }
    for (int64_t p = 0; p < np; ++p) {
      const uint8_t* pp = row + p * kPair;
      const __m128 w4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pp)));
      __m512i wq;
      if constexpr (kRQ4) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8));
        wq = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
      } else {
        wq = _mm512_loadu_si512(pp + 8);
      }
      for (int t = 0; t < kNT; ++t) {
        const __m128 prod = _mm_mul_ps(w4, _mm_loadu_ps(xs + (t * np + p) * 4));
        accm[t] = _mm_add_ps(accm[t], prod);
        const __m512 sc = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(prod));
        const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq,
                                              _mm512_loadu_si512(xq + (t * np + p) * 64));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[t]);
      }
    }
    for (int t = 0; t < kNT; ++t) {
      alignas(16) float m[4];
      _mm_store_ps(m, accm[t]);
      y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]) + (m[2] + m[3]);
    }
  }
}

template <bool kRQ4>
void rq_dispatch(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt,
                 int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (nt) {
    case 1: rq_rows<kRQ4, 1>(w, rs, np, xq, xs, r0, r1, y, ldy); break;
    case 2: rq_rows<kRQ4, 2>(w, rs, np, xq, xs, r0, r1, y, ldy); break;
    case 3: rq_rows<kRQ4, 3>(w, rs, np, xq, xs, r0, r1, y, ldy); break;
    default: rq_rows<kRQ4, 4>(w, rs, np, xq, xs, r0, r1, y, ldy); break;
  }
}

void rq_avx512(RqLayout layout, const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs,
               int nt, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (layout == RqLayout::Four) rq_dispatch<true>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
  else rq_dispatch<false>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
}

// Q6_K x Q8_K: per 16-element group, sum((q6) * x) via u8 x s8 with q6 in 0..63, minus
// 32 * bsum, times the group's scale; all in int32, one float multiply per super-block.
void q6k_avx512(const uint8_t* w, size_t row_stride, int64_t nb, const BlockQ8_K* x, int nt, int64_t r0,
                int64_t r1, float* y, int64_t ldy) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m3 = _mm256_set1_epi8(0x03);
  const __m512i group_idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w + r * row_stride);
    float acc[kMaxTile] = {};
    for (int64_t i = 0; i < nb; ++i) {
      const BlockQ6_K& b = blocks[i];
      // Unsigned 6-bit values in element order, 4 x 64 bytes.
      __m512i u[4];
      for (int n = 0; n < 2; ++n) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * n));
        const __m256i v0 = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
        const __m256i v1 = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
        const __m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
        const __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
        u[2 * n] = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
        u[2 * n + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(v2), v3, 1);
      }
      // Group scales as int32, 16 lanes... one scale per 16 elements = per 4 dword lanes.
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      const __m512i sc32 = _mm512_cvtepi8_epi32(sc8);  // [16] scales
      const float d = f16_to_f32(b.d);
      for (int t = 0; t < nt; ++t) {
        const BlockQ8_K& xb = x[t * nb + i];
        // Dot per 4-lane group: lanes of chunk c (64 elements) cover groups 4c..4c+3.
        __m512i tot = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[c],
                                                 _mm512_loadu_si512(xb.qs + 64 * c));
          // Sum each group of 4 lanes -> we multiply lanes by the group's scale first.
          const __m512i gsc = _mm512_permutexvar_epi32(
              _mm512_add_epi32(group_idx, _mm512_set1_epi32(4 * c)), sc32);
          tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(dp, gsc));
        }
        int32_t isum = _mm512_reduce_add_epi32(tot);
        int32_t corr = 0;
        for (int g = 0; g < 16; ++g) corr += b.scales[g] * xb.bsums[g];
        isum -= 32 * corr;
        acc[t] += d * xb.d * static_cast<float>(isum);
      }
    }
    for (int t = 0; t < nt; ++t) y[t * ldy + r] = acc[t];
  }
}

__m512 load16(PackKind kind, const uint8_t* row, int64_t k) {
  switch (kind) {
    case PackKind::F16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
    case PackKind::BF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k))), 16));
    default:
      return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
}

void flt_avx512(PackKind kind, const uint8_t* w, size_t row_stride, int64_t cols, const float* x, int nt,
                int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t main = cols / 16 * 16;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_stride;
    __m512 acc[kMaxTile];
    for (int t = 0; t < nt; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t k = 0; k < main; k += 16) {
      const __m512 wv = load16(kind, row, k);
      for (int t = 0; t < nt; ++t) acc[t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + t * cols + k), acc[t]);
    }
    for (int t = 0; t < nt; ++t) {
      float s = _mm512_reduce_add_ps(acc[t]);
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

const MatmulKernels& avx512_kernels() {
  static const MatmulKernels k{rq_avx512, q6k_avx512, flt_avx512};
  return k;
}

}  // namespace troupe::cpu
