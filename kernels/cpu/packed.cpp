#include "kernels/cpu/packed.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/matmul.h"  // detect_isa
#include "kernels/cpu/quant_ref.h"
#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"

namespace troupe::cpu {

AlignedBytes AlignedBytes::allocate(size_t bytes) {
  AlignedBytes a;
  // Large buffers go on 2 MiB boundaries and ask for transparent huge pages: decode streams
  // every weight once per token, and with 4 KiB pages the TLB misses cost a third of the
  // DRAM bandwidth on the machines we measured (5-10 GB/s versus 12.9 GB/s).
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = rounded ? std::aligned_alloc(align, rounded) : nullptr;
  if (rounded && !p) return a;
#ifdef MADV_HUGEPAGE
  if (p && align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  a.ptr = std::unique_ptr<uint8_t, void (*)(void*)>(static_cast<uint8_t*>(p), std::free);
  a.size = bytes;
  return a;
}

namespace {

bool is_rq(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
      return true;
    default:
      return false;
  }
}
bool is_rq4(DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q4_K; }

// Block `bi` (32 elements) of a GGUF row as w = d * u + m.
void canonical_block(DType t, const uint8_t* row, int64_t bi, uint8_t* u, float& d, float& m) {
  switch (t) {
    case DType::Q4_0: {
      const auto& b = reinterpret_cast<const BlockQ4_0*>(row)[bi];
      d = f16_to_f32(b.d);
      m = -8 * d;
      for (int j = 0; j < 16; ++j) {
        u[j] = b.qs[j] & 0xF;
        u[j + 16] = b.qs[j] >> 4;
      }
      return;
    }
    case DType::Q4_1: {
      const auto& b = reinterpret_cast<const BlockQ4_1*>(row)[bi];
      d = f16_to_f32(b.d);
      m = f16_to_f32(b.m);
      for (int j = 0; j < 16; ++j) {
        u[j] = b.qs[j] & 0xF;
        u[j + 16] = b.qs[j] >> 4;
      }
      return;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      // Dequantize, then recover u exactly: u = (w - m) / d is an integer for these types.
      const size_t bs = t == DType::Q5_0 ? sizeof(BlockQ5_0) : sizeof(BlockQ5_1);
      const uint8_t* bp = row + bi * bs;
      uint16_t dh, mh = 0;
      std::memcpy(&dh, bp, 2);
      d = f16_to_f32(dh);
      if (t == DType::Q5_1) {
        std::memcpy(&mh, bp + 2, 2);
        m = f16_to_f32(mh);
      } else {
        m = -16 * d;
      }
      uint32_t qh;
      std::memcpy(&qh, bp + (t == DType::Q5_1 ? 4 : 2), 4);
      const uint8_t* qs = bp + (t == DType::Q5_1 ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10));
        u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
      }
      return;
    }
    case DType::Q8_0: {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(row)[bi];
      d = f16_to_f32(b.d);
      m = -128 * d;
      for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(b.qs[j] + 128);
      return;
    }
    case DType::Q4_K: {
      const auto& b = reinterpret_cast<const BlockQ4_K*>(row)[bi / 8];
      const int s = static_cast<int>(bi % 8);
      uint8_t sc, mn;
      k_scale_min(s, b.scales, &sc, &mn);
      d = f16_to_f32(b.d) * sc;
      m = -f16_to_f32(b.dmin) * mn;
      const uint8_t* q = b.qs + (s / 2) * 32;
      for (int j = 0; j < 32; ++j) u[j] = (s % 2) ? (q[j] >> 4) : (q[j] & 0xF);
      return;
    }
    case DType::Q5_K: {
      const auto& b = reinterpret_cast<const BlockQ5_K*>(row)[bi / 8];
      const int s = static_cast<int>(bi % 8);
      uint8_t sc, mn;
      k_scale_min(s, b.scales, &sc, &mn);
      d = f16_to_f32(b.d) * sc;
      m = -f16_to_f32(b.dmin) * mn;
      const uint8_t* q = b.qs + (s / 2) * 32;
      const uint8_t bit = static_cast<uint8_t>(1u << s);
      for (int j = 0; j < 32; ++j)
        u[j] = static_cast<uint8_t>(((s % 2) ? (q[j] >> 4) : (q[j] & 0xF)) + ((b.qh[j] & bit) ? 16 : 0));
      return;
    }
    default:
      d = m = 0;
      std::memset(u, 0, 32);
  }
}

void pack_rq_row(DType t, const uint8_t* src_row, int64_t cols, uint8_t* dst) {
  const int64_t nb = cols / kQK;
  const bool four = is_rq4(t);
  for (int64_t p = 0; p < (nb + 1) / 2; ++p) {
    uint8_t ua[32], ub[32];
    float da, ma, db = 0, mb = 0;
    canonical_block(t, src_row, 2 * p, ua, da, ma);
    if (2 * p + 1 < nb)
      canonical_block(t, src_row, 2 * p + 1, ub, db, mb);
    else
      std::memset(ub, 0, 32);
    const uint16_t s[4] = {f32_to_f16(da), f32_to_f16(db), f32_to_f16(ma), f32_to_f16(mb)};
    std::memcpy(dst, s, 8);
    if (four) {
      for (int j = 0; j < 32; ++j) dst[8 + j] = static_cast<uint8_t>(ua[j] | (ub[j] << 4));
      dst += kRQ4PairBytes;
    } else {
      std::memcpy(dst + 8, ua, 32);
      std::memcpy(dst + 40, ub, 32);
      dst += kRQ8PairBytes;
    }
  }
}

}  // namespace

Result<PackedWeight> pack_concat(DType type, int64_t cols, const std::vector<std::pair<const void*, int64_t>>& parts) {
  PackedWeight w;
  w.source_type = type;
  w.cols = cols;
  for (auto& p : parts) w.rows += p.second;
  auto rb = row_bytes(type, static_cast<uint64_t>(cols));
  if (!rb || w.rows <= 0 || cols <= 0)
    return make_error("cannot pack a " + std::string(dtype_traits(type).name) + " matrix with " + std::to_string(cols) +
                      " columns");
  if (is_rq(type)) {
    w.kind = is_rq4(type) ? PackKind::RQ4 : PackKind::RQ8;
    w.rq_layout = is_rq4(type) ? RqLayout::Four : (type == DType::Q8_0 ? RqLayout::Eight : RqLayout::EightSmall);
    w.num_pairs = (cols / kQK + 1) / 2;
    w.row_stride = static_cast<size_t>(w.num_pairs) * (is_rq4(type) ? kRQ4PairBytes : kRQ8PairBytes);
  } else {
    switch (type) {
      case DType::Q6_K:
        w.kind = PackKind::Q6K;
        break;
      case DType::F32:
        w.kind = PackKind::F32;
        break;
      case DType::F16:
        w.kind = PackKind::F16;
        break;
      case DType::BF16:
        w.kind = PackKind::BF16;
        break;
      default:
        return make_error("no CPU matmul for weight type " + std::string(dtype_traits(type).name));
    }
    w.row_stride = *rb;
  }
  w.owned = AlignedBytes::allocate(w.row_stride * static_cast<size_t>(w.rows));
  if (!w.owned.ptr) return make_error("out of memory packing a weight");
  uint8_t* dst = w.owned.ptr.get();
  for (auto& [src, rows] : parts) {
    const auto* s = static_cast<const uint8_t*>(src);
    for (int64_t r = 0; r < rows; ++r, dst += w.row_stride) {
      if (is_rq(type))
        pack_rq_row(type, s + r * *rb, cols, dst);
      else
        std::memcpy(dst, s + r * *rb, *rb);
    }
  }
  w.data = w.owned.ptr.get();
  return w;
}

Result<PackedWeight> pack_weight(DType type, int64_t rows, int64_t cols, const void* src) {
  if (is_rq(type)) return pack_concat(type, cols, {{src, rows}});
  // Float and Q6_K weights are used in place (no copy).
  PackedWeight w;
  w.source_type = type;
  w.rows = rows;
  w.cols = cols;
  auto rb = row_bytes(type, static_cast<uint64_t>(cols));
  if (!rb) return make_error("row of " + std::to_string(cols) + " elements is not a whole number of blocks");
  w.row_stride = *rb;
  switch (type) {
    case DType::Q6_K:
      w.kind = PackKind::Q6K;
      break;
    case DType::F32:
      w.kind = PackKind::F32;
      break;
    case DType::F16:
      w.kind = PackKind::F16;
      break;
    case DType::BF16:
      w.kind = PackKind::BF16;
      break;
    default:
      return make_error("no CPU matmul for weight type " + std::string(dtype_traits(type).name));
  }
  w.data = static_cast<const uint8_t*>(src);
  return w;
}

void unpack_row(const PackedWeight& w, int64_t r, float* out) {
  const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_stride;
  switch (w.kind) {
    case PackKind::RQ4:
    case PackKind::RQ8: {
      const int64_t nb = w.cols / kQK;
      for (int64_t p = 0; p < w.num_pairs; ++p) {
        const uint8_t* pp = row + p * (w.kind == PackKind::RQ4 ? kRQ4PairBytes : kRQ8PairBytes);
        uint16_t s[4];
        std::memcpy(s, pp, 8);
        for (int h = 0; h < 2; ++h) {
          const int64_t bi = 2 * p + h;
          if (bi >= nb) break;
          const float d = f16_to_f32(s[h]), m = f16_to_f32(s[2 + h]);
          for (int j = 0; j < 32; ++j) {
            const int u = w.kind == PackKind::RQ4 ? ((pp[8 + j] >> (4 * h)) & 0xF) : pp[8 + 32 * h + j];
            out[bi * 32 + j] = d * static_cast<float>(u) + m;
          }
        }
      }
      return;
    }
    case PackKind::Q6K:
      dequantize_row_ref(DType::Q6_K, row, out, w.cols);
      return;
    case PackKind::F32:
      dequantize_row_ref(DType::F32, row, out, w.cols);
      return;
    case PackKind::F16:
      dequantize_row_ref(DType::F16, row, out, w.cols);
      return;
    case PackKind::BF16:
      dequantize_row_ref(DType::BF16, row, out, w.cols);
      return;
  }
}

void quantize_blocks_avx512(const float* x, int64_t nb, int8_t* q, bool d_as_f16, bool s_as_f16, float* d_out,
                            float* s_out);  // matmul_avx512.cpp

void quantize_activations(const float* x, int64_t cols, ActQ& out, int64_t t0, int64_t t1, const ActQuantMode& mode) {
  quantize_activations_into(x, cols, out, t0, t1, t0, mode);
}

void quantize_activations_into(const float* x, int64_t cols, ActQ& out, int64_t t0, int64_t t1, int64_t out_t0,
                               const ActQuantMode& mode) {
  // Numerics follow GGML's q8_0/q8_1 (id = 127 / amax, round half to even, d stored as f16;
  // q8_1 also stores s = d * sum(q) as f16) so that logits agree with llama.cpp on the same
  // file. Where GGML's dot product needs no offset term (symmetric types) s stays exact.
  const int64_t nb = cols / kQK;
  const int64_t np = out.num_pairs;
  static const bool simd = detect_isa() >= Isa::Avx512;
  constexpr int64_t kMaxSimdBlocks = 512;  // 16384 columns; wider rows take the scalar loop
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * cols;
    int8_t* q = out.q.data() + (out_t0 + t - t0) * np * 64;
    float* sc = out.scales.data() + (out_t0 + t - t0) * np * 4;
    if (simd && nb <= kMaxSimdBlocks) {  // the same values, 16 lanes at a time
      float d[kMaxSimdBlocks], s[kMaxSimdBlocks];
      quantize_blocks_avx512(xt, nb, q, mode.d_as_f16, mode.s_as_f16, d, s);
      for (int64_t b = 0; b < np * 2; ++b) {
        const bool live = b < nb;
        if (!live) std::memset(q + b * 32, 0, 32);
        sc[(b / 2) * 4 + b % 2] = live ? d[b] : 0.0f;
        sc[(b / 2) * 4 + 2 + b % 2] = live ? s[b] : 0.0f;
      }
      continue;
    }
    for (int64_t b = 0; b < np * 2; ++b) {
      float d = 0, s = 0;
      if (b < nb) {
        const float* xb = xt + b * kQK;
        float amax = 0;
        for (int j = 0; j < kQK; ++j) {
          const float a = std::fabs(xb[j]);
          amax = a > amax ? a : amax;
        }
        const float dd = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < kQK; ++j) {
          // Round half to even without a libm call: |x * id| <= 127, far below 2^22.
          const float r = (xb[j] * id + 12582912.0f) - 12582912.0f;
          const int v = static_cast<int>(r);
          q[b * 32 + j] = static_cast<int8_t>(v);
          sum += v;
        }
        d = mode.d_as_f16 ? f16_to_f32(f32_to_f16(dd)) : dd;
        s = mode.s_as_f16 ? f16_to_f32(f32_to_f16(dd * static_cast<float>(sum))) : d * static_cast<float>(sum);
      } else {
        std::memset(q + b * 32, 0, 32);
      }
      const int64_t p = b / 2, h = b % 2;
      sc[p * 4 + h] = d;
      sc[p * 4 + 2 + h] = s;
    }
  }
}

}  // namespace troupe::cpu
