#include "kernels/cpu/quant_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"

namespace troupe::cpu {
namespace {

void deq_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = ((b[i].qs[j] & 0xF) - 8) * d;
      y[j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}
void deq_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = (b[i].qs[j] & 0xF) * d + m;
      y[j + 16] = (b[i].qs[j] >> 4) * d + m;
    }
  }
}
template <typename B>
void q5_values(const B& b, int* q) {  // 5-bit values 0..31 in element order
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (b.qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
    q[j + 16] = (b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
  }
}
void deq_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  int q[32];
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    q5_values(b[i], q);
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = (q[j] - 16) * d;
  }
}
void deq_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  int q[32];
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    q5_values(b[i], q);
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < 32; ++j) y[j] = q[j] * d + m;
  }
}
void deq_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = b[i].qs[j] * d;
  }
}
void deq_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      k_scale_min(is, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      k_scale_min(is + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}
void deq_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, ql += 32) {
      uint8_t sc, m;
      k_scale_min(is, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      k_scale_min(is + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}
void deq_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

float absmax(const float* x, int n) {
  float a = 0;
  for (int j = 0; j < n; ++j) a = std::max(a, std::fabs(x[j]));
  return a;
}

}  // namespace

bool dequantize_row_ref(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return true;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return true;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return true;
    }
    case DType::Q4_0:
      deq_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
      return true;
    case DType::Q4_1:
      deq_q4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
      return true;
    case DType::Q5_0:
      deq_q5_0(static_cast<const BlockQ5_0*>(src), dst, n / kQK);
      return true;
    case DType::Q5_1:
      deq_q5_1(static_cast<const BlockQ5_1*>(src), dst, n / kQK);
      return true;
    case DType::Q8_0:
      deq_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
      return true;
    case DType::Q4_K:
      deq_q4_k(static_cast<const BlockQ4_K*>(src), dst, n / kQKK);
      return true;
    case DType::Q5_K:
      deq_q5_k(static_cast<const BlockQ5_K*>(src), dst, n / kQKK);
      return true;
    case DType::Q6_K:
      deq_q6_k(static_cast<const BlockQ6_K*>(src), dst, n / kQKK);
      return true;
    default:
      return false;
  }
}

bool quantize_row_ref(DType type, const float* x, void* dst, int64_t n) {
  const int64_t nb = n / kQK;
  switch (type) {
    case DType::F32:
      std::memcpy(dst, x, static_cast<size_t>(n) * 4);
      return true;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(x[i]);
      return true;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i]);
      return true;
    }
    case DType::Q4_0: {
      auto* b = static_cast<BlockQ4_0*>(dst);
      for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float amax = 0, maxv = 0;
        for (int j = 0; j < kQK; ++j)
          if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            maxv = x[j];
          }
        const float d = maxv / -8, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
          const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
          b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return true;
    }
    case DType::Q4_1: {
      auto* b = static_cast<BlockQ4_1*>(dst);
      for (int64_t i = 0; i < nb; ++i, x += kQK) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < kQK; ++j) {
          mn = std::min(mn, x[j]);
          mx = std::max(mx, x[j]);
        }
        const float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(mn);
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, static_cast<int>((x[j] - mn) * id + 0.5f));
          const int q1 = std::min(15, static_cast<int>((x[j + 16] - mn) * id + 0.5f));
          b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return true;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      const bool has_min = type == DType::Q5_1;
      auto* out = static_cast<uint8_t*>(dst);
      const size_t bs = has_min ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
      for (int64_t i = 0; i < nb; ++i, x += kQK, out += bs) {
        float d, mn = 0;
        int q[32];
        if (has_min) {
          float mx = x[0];
          mn = x[0];
          for (int j = 1; j < kQK; ++j) {
            mn = std::min(mn, x[j]);
            mx = std::max(mx, x[j]);
          }
          d = (mx - mn) / 31;
          const float id = d ? 1.0f / d : 0.0f;
          for (int j = 0; j < kQK; ++j) q[j] = std::min(31, static_cast<int>((x[j] - mn) * id + 0.5f));
        } else {
          float amax = 0, maxv = 0;
          for (int j = 0; j < kQK; ++j)
            if (std::fabs(x[j]) > amax) {
              amax = std::fabs(x[j]);
              maxv = x[j];
            }
          d = maxv / -16;
          const float id = d ? 1.0f / d : 0.0f;
          for (int j = 0; j < kQK; ++j) q[j] = std::min(31, static_cast<int>(x[j] * id + 16.5f));
        }
        uint32_t qh = 0;
        uint8_t qs[16];
        for (int j = 0; j < 16; ++j) {
          qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
          qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
          qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
        }
        const uint16_t dh = f32_to_f16(d), mh = f32_to_f16(mn);
        size_t o = 0;
        std::memcpy(out + o, &dh, 2);
        o += 2;
        if (has_min) {
          std::memcpy(out + o, &mh, 2);
          o += 2;
        }
        std::memcpy(out + o, &qh, 4);
        o += 4;
        std::memcpy(out + o, qs, 16);
      }
      return true;
    }
    case DType::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < nb; ++i, x += kQK) {
        const float d = absmax(x, kQK) / 127, id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQK; ++j) b[i].qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
      }
      return true;
    }
    case DType::Q8_K: {
      auto* b = static_cast<BlockQ8_K*>(dst);
      for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
        const float amax = absmax(x, kQKK);
        const float d = amax / 127, id = d ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < kQKK; ++j)
          b[i].qs[j] = static_cast<int8_t>(std::clamp<long>(std::lround(x[j] * id), -127, 127));
        for (int g = 0; g < 16; ++g) {
          int s = 0;
          for (int j = 0; j < 16; ++j) s += b[i].qs[g * 16 + j];
          b[i].bsums[g] = static_cast<int16_t>(s);
        }
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace troupe::cpu
