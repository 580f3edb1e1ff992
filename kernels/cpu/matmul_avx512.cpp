// AVX-512 (F/BW/VL/DQ/VNNI) kernels: u8 x s8 dot products with vpdpbusd.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/matmul.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
namespace {

// The 32-block types (RQ layouts) give the AVX2 kernels' bits, whose order is GGML's
// (llama.cpp runs that order on AVX-512 VNNI too): per (row, token) one 8-lane accumulator,
// acc = fma(dA dxA, A lanes, acc) then fma(dB dxB, B lanes, acc) pair by pair, the int32
// lane sums by vpdpbusd instead of maddubs+madd (the same values), the offsets
// (mA sA) + (mB sB) summed separately in that order, one fixed horizontal sum.
// Q8_0 (RqLayout::Eight) needs sum((u - 128) x): vpdpbusd starts from -128 * sum(x).

inline float hsum8(__m256 v) {  // the AVX2 kernels' horizontal sum, same order
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <RqLayout kL>
constexpr size_t pair_bytes() {
  return kL == RqLayout::Four ? kRQ4PairBytes : kRQ8PairBytes;
}

// The 64 unsigned weight bytes of one pair, block A and block B.
template <RqLayout kL>
inline void load_pair_u8(const uint8_t* pp, __m256i& a, __m256i& b) {
  if constexpr (kL == RqLayout::Four) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    a = _mm256_and_si256(v, m4);
    b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  } else {
    a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 8));
    b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pp + 40));
  }
}

// -128 * (4-byte group sums of x), 16 per (token, pair): Q8_0's dot products start there.
// (Recomputed per call, i.e. per 16-row chunk: a few hundred instructions.)
int32_t* fill_neg_xsum(const int8_t* xq, int64_t count) {
  auto* out = static_cast<int32_t*>(thread_scratch(0, static_cast<size_t>(count) * 16 * sizeof(int32_t)));
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < count; ++i) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(xq + i * 64));
    _mm512_storeu_si512(out + i * 16, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 7)));
  }
  return out;
}

// 1-2 tokens (decode): two rows per zmm, lanes 0-7 row a, 8-15 row b; each half is the
// AVX2 accumulator of its row. Scales and offsets come from one 4-lane product per row.
template <RqLayout kL, int kNT>
void rq_row_pair(const uint8_t* w, size_t row_stride, int64_t np, const int8_t* xq, const float* xs,
                 const int32_t* neg_xsum, int64_t ra, int64_t rb, bool store_b, float* y, int64_t ldy) {
  constexpr size_t kPair = pair_bytes<kL>();
  const __m512i idx_a = _mm512_set_epi32(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx_b = _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[kNT];
  __m256 summs[kNT];
  for (int t = 0; t < kNT; ++t) {
    acc[t] = _mm512_setzero_ps();
    summs[t] = _mm256_setzero_ps();
  }
  const uint8_t* row_a = w + ra * row_stride;
  const uint8_t* row_b = w + rb * row_stride;
  // Two short rows read side by side do not look like a stream to the hardware prefetchers:
  // fetch the pair after next explicitly (prefetches never fault, even past the last row).
  {
    const char* ahead = reinterpret_cast<const char*>(w + (ra + 4) * row_stride);
    for (size_t o = 0; o < 2 * row_stride; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
  }
  for (int64_t p = 0; p < np; ++p) {
    const uint8_t* pa = row_a + p * kPair;
    const uint8_t* pb = row_b + p * kPair;
    // [dA dB mA mB] of row a | of row b, and dA (dB) of row a in lanes 0-7, of row b in 8-15
    const __m256 w8 = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pa)),
                                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pb))));
    const __m512 ws_a = _mm512_permutexvar_ps(idx_a, _mm512_castps256_ps512(w8));
    const __m512 ws_b = _mm512_permutexvar_ps(idx_b, _mm512_castps256_ps512(w8));
    __m256i ua, ub, va, vb;
    load_pair_u8<kL>(pa, ua, ub);
    load_pair_u8<kL>(pb, va, vb);
    const __m512i wa = _mm512_inserti64x4(_mm512_castsi256_si512(ua), va, 1);
    const __m512i wb = _mm512_inserti64x4(_mm512_castsi256_si512(ub), vb, 1);
    for (int t = 0; t < kNT; ++t) {
      const float* x4 = xs + (t * np + p) * 4;  // dxA dxB sA sB
      const int8_t* xp = xq + (t * np + p) * 64;
      const __m512i xa = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp)));
      const __m512i xb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 32)));
      __m512i ia, ib;
      if constexpr (kL == RqLayout::Eight) {
        const int32_t* ns = neg_xsum + (t * np + p) * 16;
        ia = _mm512_dpbusd_epi32(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ns))), wa,
                                 xa);
        ib = _mm512_dpbusd_epi32(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ns + 8))),
                                 wb, xb);
      } else {
        ia = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, xa);
        ib = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wb, xb);
      }
      // dA * dxA is the same product the AVX2 kernel forms in its 4-lane prod.
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(ws_a, _mm512_set1_ps(x4[0])), _mm512_cvtepi32_ps(ia), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(ws_b, _mm512_set1_ps(x4[1])), _mm512_cvtepi32_ps(ib), acc[t]);
      if constexpr (kL != RqLayout::Eight) {
        const __m256 prod = _mm256_mul_ps(w8, _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x4)));
        summs[t] = _mm256_add_ps(summs[t], _mm256_permute_ps(prod, 0xAA));  // + mA sA
        summs[t] = _mm256_add_ps(summs[t], _mm256_permute_ps(prod, 0xFF));  // + mB sB
      }
    }
  }
  for (int t = 0; t < kNT; ++t) {
    y[t * ldy + ra] = hsum8(_mm512_castps512_ps256(acc[t])) + _mm256_cvtss_f32(summs[t]);
    if (store_b)
      y[t * ldy + rb] = hsum8(_mm512_extractf32x8_ps(acc[t], 1)) + _mm_cvtss_f32(_mm256_extractf128_ps(summs[t], 1));
  }
}

// 3-4 tokens (prefill tiles): the scale products dA dxA, dB dxB and the offsets are formed
// 16 rows at a time (one multiply for 16 rows instead of one per row), then each row x
// token accumulator takes its scale by an embedded broadcast. kR rows per tile.
template <RqLayout kL, int kR, int kNT>
inline void rq_tile_scaled(const uint8_t* w, size_t row_stride, int64_t np, const int8_t* xq, const int32_t* neg_xsum,
                           const float* scales /* [np][kNT][2][16] */, int64_t r, int32_t lane, __m256 acc[kR][kNT]) {
  constexpr size_t kPair = pair_bytes<kL>();
  for (int i = 0; i < kR; ++i)
    for (int t = 0; t < kNT; ++t) acc[i][t] = _mm256_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    __m256i xa[kNT], xb[kNT];
    for (int t = 0; t < kNT; ++t) {
      xa[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * np + p) * 64));
      xb[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * np + p) * 64 + 32));
    }
    const float* sp = scales + p * kNT * 32;
    for (int i = 0; i < kR; ++i) {
      __m256i ua, ub;
      load_pair_u8<kL>(w + (r + i) * row_stride + p * kPair, ua, ub);
      for (int t = 0; t < kNT; ++t) {
        __m256i ia, ib;
        if constexpr (kL == RqLayout::Eight) {
          const int32_t* ns = neg_xsum + (t * np + p) * 16;
          ia = _mm256_dpbusd_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ns)), ua, xa[t]);
          ib = _mm256_dpbusd_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ns + 8)), ub, xb[t]);
        } else {
          ia = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ua, xa[t]);
          ib = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ub, xb[t]);
        }
        acc[i][t] = _mm256_fmadd_ps(_mm256_set1_ps(sp[t * 32 + lane + i]), _mm256_cvtepi32_ps(ia), acc[i][t]);
        acc[i][t] = _mm256_fmadd_ps(_mm256_set1_ps(sp[t * 32 + 16 + lane + i]), _mm256_cvtepi32_ps(ib), acc[i][t]);
      }
    }
  }
}

// Rows per tile: four rows x four tokens is 16 accumulators, the x registers of four tokens
// shared by the four rows (two rows: 0.68-0.70 ns per block and token on Zen 4, four: 0.56-0.60).
constexpr int kTileRows = 4;

template <RqLayout kL, int kNT>
void rq_rows_scaled(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, const int32_t* neg_xsum,
                    int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr size_t kPair = pair_bytes<kL>();
  auto* scales = static_cast<float*>(thread_scratch(1, static_cast<size_t>(np) * kNT * 32 * sizeof(float)));
  alignas(64) float offs[kNT * 16];
  const __m512i row_off = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(static_cast<int32_t>(rs)));
  for (int64_t g0 = r0; g0 < r1; g0 += 16) {
    const int64_t g1 = std::min(r1, g0 + 16);
    const __mmask16 live = static_cast<__mmask16>((1u << (g1 - g0)) - 1);
    __m512 sum[kNT];
    for (int t = 0; t < kNT; ++t) sum[t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; ++p) {
      // f16 dA | dB << 16 and mA | mB << 16 of each live row (masked: rows past r1 are never read)
      const uint8_t* base = w + g0 * rs + p * kPair;
      const __m512i dd = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, row_off, base, 1);
      const __m512 da = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
      const __m512 db = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
      __m512 ma = _mm512_setzero_ps(), mb = _mm512_setzero_ps();
      if constexpr (kL != RqLayout::Eight) {
        const __m512i mm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, row_off, base + 4, 1);
        ma = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(mm));
        mb = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(mm, 16)));
      }
      for (int t = 0; t < kNT; ++t) {
        const float* x4 = xs + (t * np + p) * 4;
        float* sp = scales + (p * kNT + t) * 32;
        _mm512_storeu_ps(sp, _mm512_mul_ps(da, _mm512_set1_ps(x4[0])));
        _mm512_storeu_ps(sp + 16, _mm512_mul_ps(db, _mm512_set1_ps(x4[1])));
        if constexpr (kL != RqLayout::Eight) {
          sum[t] = _mm512_add_ps(sum[t], _mm512_mul_ps(ma, _mm512_set1_ps(x4[2])));
          sum[t] = _mm512_add_ps(sum[t], _mm512_mul_ps(mb, _mm512_set1_ps(x4[3])));
        }
      }
    }
    for (int t = 0; t < kNT; ++t) _mm512_store_ps(offs + t * 16, sum[t]);
    int64_t r = g0;
    for (; r + kTileRows <= g1; r += kTileRows) {
      __m256 acc[kTileRows][kNT];
      rq_tile_scaled<kL, kTileRows, kNT>(w, rs, np, xq, neg_xsum, scales, r, static_cast<int32_t>(r - g0), acc);
      for (int i = 0; i < kTileRows; ++i)
        for (int t = 0; t < kNT; ++t) y[t * ldy + r + i] = hsum8(acc[i][t]) + offs[t * 16 + (r - g0) + i];
    }
    for (; r + 2 <= g1; r += 2) {
      __m256 acc[2][kNT];
      rq_tile_scaled<kL, 2, kNT>(w, rs, np, xq, neg_xsum, scales, r, static_cast<int32_t>(r - g0), acc);
      for (int i = 0; i < 2; ++i)
        for (int t = 0; t < kNT; ++t) y[t * ldy + r + i] = hsum8(acc[i][t]) + offs[t * 16 + (r - g0) + i];
    }
    if (r < g1) {
      __m256 acc[1][kNT];
      rq_tile_scaled<kL, 1, kNT>(w, rs, np, xq, neg_xsum, scales, r, static_cast<int32_t>(r - g0), acc);
      for (int t = 0; t < kNT; ++t) y[t * ldy + r] = hsum8(acc[0][t]) + offs[t * 16 + (r - g0)];
    }
  }
}

// kStream: two rows at a time for any tile (rq_row_pair), which streams a weight from
// memory about three times faster at 3-4 tokens than the 16-row scaled groups, whose
// gathers walk 16 rows at once and defeat the hardware prefetcher (196608x576 Q4_1 from
// memory, 2 threads: 3 tokens 8.8 -> 2.6 ms; in the cache the groups are ~10% faster).
template <RqLayout kL, int kNT, bool kStream>
void rq_rows(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int64_t r0, int64_t r1,
             float* y, int64_t ldy) {
  int32_t* neg_xsum = nullptr;
  if constexpr (kL == RqLayout::Eight) neg_xsum = fill_neg_xsum(xq, kNT * np);
  // Q8_0 too since the 4-row tiles (576x576 at 64 tokens: 0.80 -> 0.55-0.59 ns per block and token)
  if constexpr (kNT >= 3 && !kStream) {
    rq_rows_scaled<kL, kNT>(w, rs, np, xq, xs, neg_xsum, r0, r1, y, ldy);
  } else {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) rq_row_pair<kL, kNT>(w, rs, np, xq, xs, neg_xsum, r, r + 1, true, y, ldy);
    if (r < r1) rq_row_pair<kL, kNT>(w, rs, np, xq, xs, neg_xsum, r, r, false, y, ldy);
  }
}

template <RqLayout kL, bool kStream>
void rq_dispatch(const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt, int64_t r0,
                 int64_t r1, float* y, int64_t ldy) {
  switch (nt) {
    case 1:
      rq_rows<kL, 1, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 2:
      rq_rows<kL, 2, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 3:
      rq_rows<kL, 3, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 4:
      rq_rows<kL, 4, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    // Streaming, up to 8 tokens share each weight load (a speculative step's 1 + drafts).
    case 5:
      if constexpr (kStream) rq_rows<kL, 5, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 6:
      if constexpr (kStream) rq_rows<kL, 6, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    case 7:
      if constexpr (kStream) rq_rows<kL, 7, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
    default:
      if constexpr (kStream)
        rq_rows<kL, 8, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      else
        rq_rows<kL, 4, kStream>(w, rs, np, xq, xs, r0, r1, y, ldy);
      break;
  }
}

template <bool kStream>
void rq_layout_dispatch(RqLayout layout, const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs,
                        int nt, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (layout) {
    case RqLayout::Four:
      rq_dispatch<RqLayout::Four, kStream>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
      break;
    case RqLayout::EightSmall:
      rq_dispatch<RqLayout::EightSmall, kStream>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
      break;
    case RqLayout::Eight:
      rq_dispatch<RqLayout::Eight, kStream>(w, rs, np, xq, xs, nt, r0, r1, y, ldy);
      break;
  }
}

void rq_avx512(RqLayout layout, const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs, int nt,
               int64_t r0, int64_t r1, float* y, int64_t ldy) {
  rq_layout_dispatch<false>(layout, w, rs, np, xq, xs, nt, r0, r1, y, ldy);
}

void rq_stream_avx512(RqLayout layout, const uint8_t* w, size_t rs, int64_t np, const int8_t* xq, const float* xs,
                      int nt, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  rq_layout_dispatch<true>(layout, w, rs, np, xq, xs, nt, r0, r1, y, ldy);
}

// Q6_K x Q8_K: per 16-element group, sum((q6) * x) via u8 x s8 with q6 in 0..63, minus
// 32 * bsum, times the group's scale; all in int32, one float multiply per super-block.
void q6k_avx512(const uint8_t* w, size_t row_stride, int64_t nb, const BlockQ8_K* x, int nt, int64_t r0, int64_t r1,
                float* y, int64_t ldy) {
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
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[c], _mm512_loadu_si512(xb.qs + 64 * c));
          // Sum each group of 4 lanes -> we multiply lanes by the group's scale first.
          const __m512i gsc = _mm512_permutexvar_epi32(_mm512_add_epi32(group_idx, _mm512_set1_epi32(4 * c)), sc32);
          tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(dp, gsc));
        }
        int32_t isum = _mm512_reduce_add_epi32(tot);
        int32_t corr = 0;
        for (int g = 0; g < 16; ++g) corr += b.scales[g] * xb.bsums[g];
        isum -= 32 * corr;
        acc[t] = std::fma(d * xb.d, static_cast<float>(isum), acc[t]);  // one rounding in both ISAs' files
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

void flt_avx512(PackKind kind, const uint8_t* w, size_t row_stride, int64_t cols, const float* x, int nt, int64_t r0,
                int64_t r1, float* y, int64_t ldy) {
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

// One token's 32-element blocks of activations as int8, GGML's q8 rounding (the scalar loop
// in quantize_activations, packed.cpp, gives the same values): per block amax = max |x|,
// q = (int)((x * id + 0x1.8p23) - 0x1.8p23) with id = 127 / amax, the multiply and the adds
// as separate roundings (this file is built with -ffp-contract=off); d = amax / 127 and
// s = d * sum(q), each through f16 where asked (F16C's round to nearest even, the same as
// f32_to_f16, checked by the test of the formula).
void quantize_blocks_avx512(const float* x, int64_t nb, int8_t* q, bool d_as_f16, bool s_as_f16, float* d_out,
                            float* s_out) {
  auto via_f16 = [](float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); };
  const __m512 sign = _mm512_set1_ps(-0.0f), magic = _mm512_set1_ps(12582912.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    // max(|x|, running) keeps the running value on a NaN, as the scalar a > amax ? a : amax
    __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_andnot_ps(sign, x1), m);
    const float a = _mm512_reduce_max_ps(m);
    const float id = a != 0.0f ? 127.0f / a : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i v0 = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x0, vid), magic), magic));
    const __m512i v1 = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x1, vid), magic), magic));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 32), _mm512_cvtepi32_epi8(v0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 32 + 16), _mm512_cvtepi32_epi8(v1));
    const float sum = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1)));
    const float dd = a / 127.0f;
    const float d = d_as_f16 ? via_f16(dd) : dd;
    d_out[b] = d;
    s_out[b] = s_as_f16 ? via_f16(dd * sum) : d * sum;
  }
}

const MatmulKernels& avx512_kernels() {
  static const MatmulKernels k{rq_avx512, rq_stream_avx512, kMaxStreamTile, q6k_avx512, flt_avx512};
  return k;
}

}  // namespace troupe::cpu
