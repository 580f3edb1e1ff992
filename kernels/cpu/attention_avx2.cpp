// AVX2/FMA/F16C body of attention_tile (kernels/cpu/attention.h) for head_dim % 64 == 0.
//
// Same bits as the portable path in attention.cpp, which runs dot_f32 per (key, query) and
// axpy_f32 per (key, query): here a query row is scored against eight keys at once, with
// one accumulator per key holding exactly the lanes of dot_f32's 8-lane accumulator, and
// the eight reductions done together after a transpose, in dot_f32's order; P·V keeps 64
// output dims in registers while it walks the keys in order, the same fused multiply-adds
// axpy_f32 does through memory. K and V rows are converted from f16 once per tile.
// So a query's result still depends only on its own row and the cache, never on its tile.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_simd.h"
#include "kernels/cpu/matmul.h"  // thread_scratch
#include "kernels/cpu/ops.h"

namespace troupe::cpu {
namespace {

constexpr int kKeys = 8;     // keys scored at once (one lane each after the transpose)
constexpr int kVBlock = 32;  // V rows converted at once for P·V
using simd::kAhead;
using simd::load_f16x8;
using simd::prefetch_l2;

// expf(x) for 8 floats with the same bits as glibc's expf on FMA machines (__expf_fma,
// glibc 2.28+: the Arm optimized-routines algorithm -- k = round(x * 32 / ln 2), a 32-entry
// table of 2^(i/32) and a cubic in double precision); checked against std::exp for every
// float in [-103.97, 0], the softmax's inputs, and by a test on samples of that range.
// Inputs below -0x1.9fe368p6 (exp underflows) give 0 as glibc does.
struct Exp2fTable {
  alignas(32) uint64_t tab[32];
  Exp2fTable() {
    for (int i = 0; i < 32; ++i) {
      const double d = static_cast<double>(exp2l(static_cast<long double>(i) / 32));
      uint64_t u;
      std::memcpy(&u, &d, 8);
      tab[i] = u - (static_cast<uint64_t>(i) << 47);
    }
  }
};

inline __m128 expf4_from(__m128 x, const long long* tab) {
  const __m256d inv_ln2_n = _mm256_set1_pd(0x1.71547652b82fep+0 * 32), shift = _mm256_set1_pd(0x1.8p+52);
  const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32),
                c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32), c2 = _mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32),
                one = _mm256_set1_pd(1.0);
  const __m256d xd = _mm256_cvtps_pd(x);
  __m256d kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
  __m256i t = _mm256_i64gather_epi64(tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  const __m256d z = _mm256_fmadd_pd(c0, r, c1);
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(c2, r, one);
  y = _mm256_fmadd_pd(z, r2, y);
  y = _mm256_mul_pd(y, _mm256_castsi256_pd(t));
  const __m128 out = _mm256_cvtpd_ps(y);
  return _mm_andnot_ps(_mm_cmplt_ps(x, _mm_set1_ps(-0x1.9fe368p6f)), out);
}

}  // namespace

// x[i] = expf(x[i] - sub) for i < n.
void exp_sub_row_avx2(float* x, int32_t n, float sub) {
  static const Exp2fTable table;
  const auto* tab = reinterpret_cast<const long long*>(table.tab);
  const __m256 vs = _mm256_set1_ps(sub);
  int32_t i = 0;
  const __m256 big = _mm256_set1_ps(88.0f);  // above this the table trick does not apply
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vs);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, big, _CMP_GT_OQ))) {  // (never in a softmax: inputs <= 0)
      for (int32_t j = i; j < i + 8; ++j) x[j] = std::exp(x[j] - sub);
      continue;
    }
    _mm_storeu_ps(x + i, expf4_from(_mm256_castps256_ps128(v), tab));
    _mm_storeu_ps(x + i + 4, expf4_from(_mm256_extractf128_ps(v, 1), tab));
  }
  for (; i < n; ++i) x[i] = std::exp(x[i] - sub);
}

void attention_tile_avx2(const AttentionTile& a) {
  const int32_t hd = a.head_dim, G = a.group, nq = a.num * G;
  int32_t len = 0;
  for (int32_t i = 0; i < a.num; ++i) len = std::max(len, a.positions[i] + 1);
  const int32_t len8 = (len + kKeys - 1) / kKeys * kKeys;
  // Scratch (thread_scratch: no std::vector code under AVX flags here): queries as f32 [nq, hd],
  // scores [nq, len8], 8 K rows [8, hd], V rows [32, hd], an f16 row.
  const size_t n_qr = static_cast<size_t>(nq) * hd, n_sc = static_cast<size_t>(nq) * len8;
  const size_t n_kt = static_cast<size_t>(hd) * kKeys, n_vf = static_cast<size_t>(kVBlock) * hd;
  const size_t n_qh = std::max(n_qr, static_cast<size_t>(len8));
  auto round16 = [](size_t n) { return (n + 15) / 16 * 16; };  // floats: 64-byte boundaries
  float* qr = static_cast<float*>(thread_scratch(
      2, (round16(n_qr) + round16(n_sc) + round16(n_kt) + round16(n_vf) + round16((n_qh + 1) / 2)) * sizeof(float)));
  float* scores = qr + round16(n_qr);
  float* kt = scores + round16(n_sc);
  float* vf = kt + round16(n_kt);
  auto* qh = reinterpret_cast<uint16_t*>(vf + round16(n_vf));
  // Queries rounded to f16 like the f16 keys they meet (as GGML does).
  for (int32_t i = 0; i < a.num; ++i)
    f32_to_f16_row(a.q + i * a.ld_q + int64_t{a.kv_head} * G * hd, qh + int64_t{i} * G * hd, int64_t{G} * hd);
  f16_to_f32_row(qh, qr, static_cast<int64_t>(n_qr));
  auto slot_of = [&](int32_t p) {
    return static_cast<int64_t>(a.block_table[p / a.block_size]) * a.block_size + p % a.block_size;
  };
  const uint16_t* k_head = a.k + int64_t{a.kv_head} * hd;
  const uint16_t* v_head = a.v + int64_t{a.kv_head} * hd;

  // Scores, eight keys per pass: per query row one 8-lane accumulator per key (lane l sums
  // dims l, l+8, ... like dot_f32's), then an 8x8 transpose so that dot_f32's reduction
  // ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)) runs for the eight keys at once.
  // This head's part of each cache row, and the next heads' when their passes come next on
  // this core (AttentionTile::prefetch_heads).
  const int32_t row_bytes = simd::prefetch_bytes(a);
  for (int32_t p = 0; p < std::min(len, kAhead); ++p) prefetch_l2(k_head + slot_of(p) * a.row, row_bytes);
  for (int32_t p0 = 0; p0 < len; p0 += kKeys) {
    const int32_t nk = std::min(kKeys, len - p0);
    for (int32_t p = p0 + kAhead; p < std::min(len, p0 + kAhead + kKeys); ++p)
      prefetch_l2(k_head + slot_of(p) * a.row, row_bytes);
    for (int32_t j = 0; j < kKeys; ++j) {
      float* dst = kt + int64_t{j} * hd;
      if (j < nk) {
        const uint16_t* src = k_head + slot_of(p0 + j) * a.row;
        for (int32_t c = 0; c < hd; c += 8) _mm256_storeu_ps(dst + c, load_f16x8(src + c));
      } else {
        for (int32_t c = 0; c < hd; c += 8) _mm256_storeu_ps(dst + c, _mm256_setzero_ps());
      }
    }
    const __m256 scale = _mm256_set1_ps(a.scale);
    for (int32_t i = 0; i < a.num; ++i) {
      if (a.positions[i] < p0) continue;
      for (int32_t g = 0; g < G; ++g) {
        const float* qv = qr + (int64_t{i} * G + g) * hd;
        __m256 acc[8];
        for (int32_t j = 0; j < kKeys; ++j) acc[j] = _mm256_setzero_ps();
        for (int32_t c = 0; c < hd; c += 8) {
          const __m256 qc = _mm256_loadu_ps(qv + c);
          for (int32_t j = 0; j < kKeys; ++j)
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(kt + int64_t{j} * hd + c), qc, acc[j]);
        }
        simd::transpose8(acc);  // acc[l] = lane l of every key's accumulator
        _mm256_storeu_ps(scores + static_cast<size_t>(i * G + g) * len8 + p0,
                         _mm256_mul_ps(simd::reduce8_lanes(acc), scale));
      }
    }
  }

  // Softmax per query row, weights rounded to f16 like the f16 values they scale (as GGML does).
  for (int32_t i = 0; i < a.num; ++i) {
    const int32_t n = a.positions[i] + 1;
    for (int32_t g = 0; g < G; ++g) {
      float* sc = scores + static_cast<size_t>(i * G + g) * len8;
      exp_sub_row_avx2(sc, n, simd::row_max(sc, n));
      double sum = 0;
      for (int32_t p = 0; p < n; ++p) sum += sc[p];
      const float inv = static_cast<float>(1.0 / sum);
      for (int32_t p = 0; p < n; ++p) sc[p] *= inv;
      f32_to_f16_row(sc, qh, n);
      f16_to_f32_row(qh, sc, n);
      float* o = a.out + i * a.ld_out + (int64_t{a.kv_head} * G + g) * hd;
      for (int32_t c = 0; c < hd; c += 8) _mm256_storeu_ps(o + c, _mm256_setzero_ps());
    }
  }

  // P·V: 64 output dims in registers, keys in order.
  for (int32_t p = 0; p < std::min(len, kAhead); ++p) prefetch_l2(v_head + slot_of(p) * a.row, row_bytes);
  for (int32_t p0 = 0; p0 < len; p0 += kVBlock) {
    const int32_t nv = std::min(kVBlock, len - p0);
    for (int32_t p = p0 + kAhead; p < std::min(len, p0 + kAhead + kVBlock); ++p)
      prefetch_l2(v_head + slot_of(p) * a.row, row_bytes);
    for (int32_t j = 0; j < nv; ++j) {
      const uint16_t* src = v_head + slot_of(p0 + j) * a.row;
      for (int32_t c = 0; c < hd; c += 8) _mm256_storeu_ps(vf + int64_t{j} * hd + c, load_f16x8(src + c));
    }
    for (int32_t i = 0; i < a.num; ++i) {
      const int32_t end = std::min(nv, a.positions[i] + 1 - p0);
      if (end <= 0) continue;
      for (int32_t g = 0; g < G; ++g) {
        const float* w = scores + static_cast<size_t>(i * G + g) * len8 + p0;
        float* o = a.out + i * a.ld_out + (int64_t{a.kv_head} * G + g) * hd;
        for (int32_t d0 = 0; d0 < hd; d0 += 64) {
          __m256 acc[8];
          for (int32_t l = 0; l < 8; ++l) acc[l] = _mm256_loadu_ps(o + d0 + 8 * l);
          for (int32_t j = 0; j < end; ++j) {
            const __m256 wj = _mm256_set1_ps(w[j]);
            const float* vr = vf + int64_t{j} * hd + d0;
            for (int32_t l = 0; l < 8; ++l) acc[l] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vr + 8 * l), acc[l]);
          }
          for (int32_t l = 0; l < 8; ++l) _mm256_storeu_ps(o + d0 + 8 * l, acc[l]);
        }
      }
    }
  }
}

}  // namespace troupe::cpu
