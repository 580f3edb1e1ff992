// Portable kernels; also the reference the SIMD kernels are checked against.
#include <cstring>

#include "kernels/cpu/matmul.h"
#include "kernels/fp16.h"

namespace troupe::cpu {
namespace {

void rq_scalar(RqLayout layout, const uint8_t* w, size_t row_stride, int64_t np, const int8_t* xq, const float* xs,
               int nt, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const bool is_rq4 = layout == RqLayout::Four;
  const size_t pair_bytes = is_rq4 ? kRQ4PairBytes : kRQ8PairBytes;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_stride;
    for (int t = 0; t < nt; ++t) {
      const int8_t* q = xq + t * np * 64;
      const float* s = xs + t * np * 4;
      float acc = 0;
      for (int64_t p = 0; p < np; ++p) {
        const uint8_t* pp = row + p * pair_bytes;
        uint16_t h[4];
        std::memcpy(h, pp, 8);
        int32_t da = 0, db = 0;
        for (int j = 0; j < 32; ++j) {
          const int ua = is_rq4 ? (pp[8 + j] & 0xF) : pp[8 + j];
          const int ub = is_rq4 ? (pp[8 + j] >> 4) : pp[40 + j];
          da += ua * q[p * 64 + j];
          db += ub * q[p * 64 + 32 + j];
        }
        acc += f16_to_f32(h[0]) * s[p * 4 + 0] * static_cast<float>(da) +
               f16_to_f32(h[1]) * s[p * 4 + 1] * static_cast<float>(db) + f16_to_f32(h[2]) * s[p * 4 + 2] +
               f16_to_f32(h[3]) * s[p * 4 + 3];
      }
      y[t * ldy + r] = acc;
    }
  }
}

// Q6_K super-block as signed values (q - 32) in element order.
void q6k_values(const BlockQ6_K& b, int8_t* v) {
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b.ql + 64 * n;
    const uint8_t* qh = b.qh + 32 * n;
    int8_t* o = v + 128 * n;
    for (int l = 0; l < 32; ++l) {
      o[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      o[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      o[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      o[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

void q6k_scalar(const uint8_t* w, size_t row_stride, int64_t nb, const BlockQ8_K* x, int nt, int64_t r0, int64_t r1,
                float* y, int64_t ldy) {
  int8_t v[256];
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w + r * row_stride);
    float acc[kMaxTile] = {};
    for (int64_t i = 0; i < nb; ++i) {
      q6k_values(blocks[i], v);
      const float d = f16_to_f32(blocks[i].d);
      for (int t = 0; t < nt; ++t) {
        const BlockQ8_K& xb = x[t * nb + i];
        int32_t isum = 0;
        for (int g = 0; g < 16; ++g) {
          int32_t s = 0;
          for (int j = 0; j < 16; ++j) s += v[g * 16 + j] * xb.qs[g * 16 + j];
          isum += s * blocks[i].scales[g];
        }
        acc[t] += d * xb.d * static_cast<float>(isum);
      }
    }
    for (int t = 0; t < nt; ++t) y[t * ldy + r] = acc[t];
  }
}

float load_elem(PackKind kind, const uint8_t* row, int64_t k) {
  switch (kind) {
    case PackKind::F32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case PackKind::F16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return f16_to_f32(h);
    }
    case PackKind::BF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return bf16_to_f32(h);
    }
    default:
      return 0;
  }
}

void flt_scalar(PackKind kind, const uint8_t* w, size_t row_stride, int64_t cols, const float* x, int nt, int64_t r0,
                int64_t r1, float* y, int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w + r * row_stride;
    for (int t = 0; t < nt; ++t) {
      const float* xt = x + t * cols;
      float acc = 0;
      for (int64_t k = 0; k < cols; ++k) acc += load_elem(kind, row, k) * xt[k];
      y[t * ldy + r] = acc;
    }
  }
}

}  // namespace

const MatmulKernels& scalar_kernels() {
  static const MatmulKernels k{rq_scalar, rq_scalar, kMaxTile, q6k_scalar, flt_scalar};
  return k;
}

}  // namespace troupe::cpu
