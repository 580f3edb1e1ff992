// AVX-512VL body of attention_tile (kernels/cpu/attention.h) for head_dim % 64 == 0, one
// query of the tile after another. Same bits as attention_tile_portable and attention_tile_avx2.
//
// The AVX2 body converts each K and V row into a scratch row and reloads it per query head;
// for a decode tile (one query) that store and reload cost more than the arithmetic, and
// for the 4-query prefill tiles converting in registers once per query still wins (measured
// with troupe_attention_bench, bench/results/cpu-kernels.md). Here up to three query
// heads of the group are scored together: per 8-dim chunk each of eight keys is converted in
// a register and met by all three heads (24 accumulators, which needs AVX-512VL's 32 vector
// registers), then the same transpose and reduction as the AVX2 body (dot_f32's order). P·V
// walks the keys in order with 32 output dims of each head in registers, each V chunk
// converted once for the three heads; the fused multiply-adds are axpy_f32's. The softmax's
// three double sums run interleaved, each in key order. Key addresses come from one walk of
// the block table (no division per key).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/matmul.h"  // thread_scratch
#include "kernels/cpu/ops.h"

namespace troupe::cpu {

void exp_sub_row_avx2(float* x, int32_t n, float sub);

namespace {

constexpr int kKeys = 8;
using simd::kAhead;
using simd::load_f16x8;
using simd::prefetch_l2;

// Scores of R query rows (q, stride hd) against the keys at k + off[0..len), scaled, into
// sc (stride ld); keys past len meet the zero row z.
// row_bytes: how much of each cache row to prefetch (simd::prefetch_bytes).
template <int R>
void score_rows(const float* q, int32_t hd, const uint16_t* k, const int64_t* off, int32_t len, const uint16_t* z,
                float scale, float* sc, int64_t ld, int32_t row_bytes) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int32_t p = 0; p < std::min(len, kAhead); ++p) prefetch_l2(k + off[p], row_bytes);
  for (int32_t p0 = 0; p0 < len; p0 += kKeys) {
    for (int32_t p = p0 + kAhead; p < std::min(len, p0 + kAhead + kKeys); ++p) prefetch_l2(k + off[p], row_bytes);
    const uint16_t* kp[kKeys];
    for (int32_t j = 0; j < kKeys; ++j) kp[j] = p0 + j < len ? k + off[p0 + j] : z;
    __m256 acc[R][kKeys];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kKeys; ++j) acc[r][j] = _mm256_setzero_ps();
    for (int32_t c = 0; c < hd; c += 8) {
      __m256 qc[R];
      for (int r = 0; r < R; ++r) qc[r] = _mm256_loadu_ps(q + int64_t{r} * hd + c);
      for (int j = 0; j < kKeys; ++j) {
        const __m256 kv = load_f16x8(kp[j] + c);
        for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(kv, qc[r], acc[r][j]);
      }
    }
    for (int r = 0; r < R; ++r) {
      simd::transpose8(acc[r]);
      _mm256_storeu_ps(sc + r * ld + p0, _mm256_mul_ps(simd::reduce8_lanes(acc[r]), vscale));
    }
  }
}

// o[r][0..hd) = sum over keys j < n of w[r][j] * V_j, keys in order, from zero.
template <int R>
void pv_rows(const float* w, int64_t ld_w, const uint16_t* v, const int64_t* off, int32_t n, int32_t hd, float* o,
             int32_t row_bytes) {
  for (int32_t d0 = 0; d0 < hd; d0 += 32) {
    __m256 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < 4; ++l) acc[r][l] = _mm256_setzero_ps();
    for (int32_t j = 0; j < n; ++j) {
      if (d0 == 0 && j + kAhead < n) prefetch_l2(v + off[j + kAhead], row_bytes);
      const uint16_t* vr = v + off[j] + d0;
      __m256 vv[4];
      for (int l = 0; l < 4; ++l) vv[l] = load_f16x8(vr + 8 * l);
      for (int r = 0; r < R; ++r) {
        const __m256 wj = _mm256_set1_ps(w[r * ld_w + j]);
        for (int l = 0; l < 4; ++l) acc[r][l] = _mm256_fmadd_ps(wj, vv[l], acc[r][l]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < 4; ++l) _mm256_storeu_ps(o + int64_t{r} * hd + d0 + 8 * l, acc[r][l]);
  }
}

// Softmax of R rows of n scores (stride ld), then rounded to f16 (h: scratch of n halves).
template <int R>
void softmax_rows(float* sc, int64_t ld, int32_t n, uint16_t* h) {
  double sum[R];
  for (int r = 0; r < R; ++r) {
    float* s = sc + r * ld;
    exp_sub_row_avx2(s, n, simd::row_max(s, n));
    sum[r] = 0;
  }
  for (int32_t p = 0; p < n; ++p)  // R independent chains, each in key order
    for (int r = 0; r < R; ++r) sum[r] += sc[r * ld + p];
  for (int r = 0; r < R; ++r) {
    float* s = sc + r * ld;
    const float inv = static_cast<float>(1.0 / sum[r]);
    for (int32_t p = 0; p < n; ++p) s[p] *= inv;
    f32_to_f16_row(s, h, n);
    f16_to_f32_row(h, s, n);
  }
}

template <int R>
void heads(const float* qr, int32_t hd, const AttentionTile& a, const uint16_t* k_head, const uint16_t* v_head,
           const int64_t* off, int32_t n, const uint16_t* z, float* sc, int64_t ld, uint16_t* h, float* o) {
  const int32_t row_bytes = simd::prefetch_bytes(a);
  score_rows<R>(qr, hd, k_head, off, n, z, a.scale, sc, ld, row_bytes);
  for (int32_t p = 0; p < std::min(n, kAhead); ++p) prefetch_l2(v_head + off[p], row_bytes);
  softmax_rows<R>(sc, ld, n, h);
  pv_rows<R>(sc, ld, v_head, off, n, hd, o, row_bytes);
}

}  // namespace

void attention_tile_avx512(const AttentionTile& a) {
  const int32_t hd = a.head_dim, G = a.group;
  int32_t len = 0;
  for (int32_t i = 0; i < a.num; ++i) len = std::max(len, a.positions[i] + 1);
  const int32_t len8 = (len + kKeys - 1) / kKeys * kKeys;
  // Scratch: one query's heads [G, hd] f32, scores [G, len8], key offsets [len], a zero f16
  // row, halves.
  auto round16 = [](size_t c) { return (c + 15) / 16 * 16; };  // 4-byte units: 64-byte boundaries
  const size_t n_q = static_cast<size_t>(G) * hd, n_sc = static_cast<size_t>(G) * len8;
  const size_t n_off = 2 * static_cast<size_t>(len), n_z = (static_cast<size_t>(hd) + 1) / 2;
  const size_t n_h = (std::max(n_q, static_cast<size_t>(len8)) + 1) / 2;
  float* qr = static_cast<float*>(
      thread_scratch(2, (round16(n_q) + round16(n_sc) + round16(n_off) + round16(n_z) + round16(n_h)) * sizeof(float)));
  float* sc = qr + round16(n_q);
  auto* off = reinterpret_cast<int64_t*>(sc + round16(n_sc));
  auto* z = reinterpret_cast<uint16_t*>(sc + round16(n_sc) + round16(n_off));
  auto* h = reinterpret_cast<uint16_t*>(sc + round16(n_sc) + round16(n_off) + round16(n_z));
  std::memset(z, 0, static_cast<size_t>(hd) * sizeof(uint16_t));
  for (int32_t p = 0, b = 0; p < len; ++b) {
    const int64_t base = int64_t{a.block_table[b]} * a.block_size;
    for (int32_t i = 0; i < a.block_size && p < len; ++i, ++p) off[p] = (base + i) * a.row;
  }
  const uint16_t* k_head = a.k + int64_t{a.kv_head} * hd;
  const uint16_t* v_head = a.v + int64_t{a.kv_head} * hd;
  for (int32_t i = 0; i < a.num; ++i) {
    const int32_t n = a.positions[i] + 1;
    // The query rounded to f16 like the f16 keys it meets (as GGML does).
    f32_to_f16_row(a.q + i * a.ld_q + int64_t{a.kv_head} * G * hd, h, int64_t{G} * hd);
    f16_to_f32_row(h, qr, int64_t{G} * hd);
    float* out = a.out + i * a.ld_out + int64_t{a.kv_head} * G * hd;
    for (int32_t g = 0; g < G; g += 3) {
      const float* q = qr + int64_t{g} * hd;
      float* s = sc + static_cast<int64_t>(g) * len8;
      float* o = out + int64_t{g} * hd;
      switch (std::min(3, G - g)) {
        case 3:
          heads<3>(q, hd, a, k_head, v_head, off, n, z, s, len8, h, o);
          break;
        case 2:
          heads<2>(q, hd, a, k_head, v_head, off, n, z, s, len8, h, o);
          break;
        default:
          heads<1>(q, hd, a, k_head, v_head, off, n, z, s, len8, h, o);
          break;
      }
    }
  }
}

}  // namespace troupe::cpu
