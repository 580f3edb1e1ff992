#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/fp16.h"

namespace troupe::cpu {

void exp_sub_row_avx2(float* x, int32_t n, float sub);

namespace {
bool has_avx2() {  // the AVX2 bodies also need FMA and F16C, which detect_isa() requires for avx2
  static const bool v = detect_isa() != Isa::Scalar;
  return v;
}
bool has_avx512() {
  static const bool v = detect_isa() >= Isa::Avx512;
  return v;
}
}  // namespace

void exp_sub_row(float* x, int32_t n, float sub) {
  if (has_avx2()) return exp_sub_row_avx2(x, n, sub);
  for (int32_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - sub);
}

void attention_tile(const AttentionTile& a) {
  if (has_avx512() && a.head_dim % 64 == 0) return attention_tile_avx512(a);
  if (has_avx2() && a.head_dim % 64 == 0) return attention_tile_avx2(a);
  attention_tile_portable(a);
}

void attention_tile_portable(const AttentionTile& a) {
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
  auto slot_of = [&](int32_t p) {
    return static_cast<int64_t>(a.block_table[p / a.block_size]) * a.block_size + p % a.block_size;
  };
  for (int32_t p = 0; p < len; ++p) {
    f16_to_f32_row(a.k + slot_of(p) * a.row + int64_t{a.kv_head} * hd, row.data(), hd);
    for (int32_t i = 0; i < a.num; ++i) {
      if (p > a.positions[i]) continue;
      for (int32_t g = 0; g < G; ++g)
        scores[static_cast<size_t>(i * G + g) * len + p] =
            dot_f32(row.data(), qr.data() + (int64_t{i} * G + g) * hd, hd) * a.scale;
    }
  }
  for (int32_t i = 0; i < a.num; ++i) {
    const int32_t n = a.positions[i] + 1;
    for (int32_t g = 0; g < G; ++g) {
      float* sc = scores.data() + static_cast<size_t>(i * G + g) * len;
      float mx = -std::numeric_limits<float>::infinity();
      for (int32_t p = 0; p < n; ++p) mx = std::max(mx, sc[p]);
      double sum = 0;
      for (int32_t p = 0; p < n; ++p) {
        sc[p] = std::exp(sc[p] - mx);
        sum += sc[p];
      }
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
