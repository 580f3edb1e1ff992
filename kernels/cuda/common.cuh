// Device helpers shared by the CUDA ops: GGUF block decoding (32 elements at a time) and
// warp reductions. Only .cu files include this; CPU-only code never sees device code.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cuda/ops.h"

// A device function kept out of line, so that it adds no registers to its caller's (a
// kernel's once-per-block tail); the CPU emulation inlines as it likes.
#ifdef TROUPE_CUDA_EMULATION
#define TROUPE_NOINLINE
#else
#define TROUPE_NOINLINE __noinline__
#endif

namespace troupe::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// SiLU-gated product silu(g) * u (silu_mul_kernel and the GEMV epilogue), with explicit
// rounding so that nvcc cannot contract expf's last step into the add differently in the
// two kernels: both give the same bits.
__device__ __forceinline__ float silu_gate(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}
// One RoPE rotation, with explicit rounding so that every kernel doing it (rope.cu, the
// GEMV epilogue) rounds alike whatever the compiler would contract.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
  *y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
__device__ __forceinline__ uint16_t ld16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// 32 bytes at a 16-byte-aligned address as eight words (two 16-byte loads).
__device__ __forceinline__ void ld32x8(const uint8_t* p, uint32_t* w) {
  const uint4 a = reinterpret_cast<const uint4*>(p)[0], b = reinterpret_cast<const uint4*>(p)[1];
  w[0] = a.x;
  w[1] = a.y;
  w[2] = a.z;
  w[3] = a.w;
  w[4] = b.x;
  w[5] = b.y;
  w[6] = b.z;
  w[7] = b.w;
}
__device__ __forceinline__ uint32_t byte_of(const uint32_t* w, int l) { return (w[l >> 2] >> (8 * (l & 3))) & 0xFF; }

// Decodes elements [32 c, 32 c + 32) of one device row (kernels/cuda/layout.h) of nb
// 32-value chunks. `row` is the row's first byte, 16-byte aligned; Q4_0, Q4_1, Q5_0, Q5_1
// and Q8_0 rows are split (quants, high bits, scales), the others as in the file.
template <DType T>
__device__ __forceinline__ void dequant32(const uint8_t* row, int64_t c, int64_t nb, float* out);

template <>
__device__ __forceinline__ void dequant32<DType::F32>(const uint8_t* row, int64_t c, int64_t /*nb*/, float* out) {
  const float4* p = reinterpret_cast<const float4*>(row) + c * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 v = p[i];
    out[4 * i] = v.x;
    out[4 * i + 1] = v.y;
    out[4 * i + 2] = v.z;
    out[4 * i + 3] = v.w;
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::F16>(const uint8_t* row, int64_t c, int64_t /*nb*/, float* out) {
  const uint4* p = reinterpret_cast<const uint4*>(row) + c * 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = p[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[8 * i + 2 * j] = h2f(static_cast<uint16_t>(w[j] & 0xFFFF));
      out[8 * i + 2 * j + 1] = h2f(static_cast<uint16_t>(w[j] >> 16));
    }
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::BF16>(const uint8_t* row, int64_t c, int64_t /*nb*/, float* out) {
  const uint4* p = reinterpret_cast<const uint4*>(row) + c * 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 v = p[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      out[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
      out[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
    }
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::Q4_0>(const uint8_t* row, int64_t c, int64_t nb, float* out) {
  const uint4 q4 = reinterpret_cast<const uint4*>(row)[c];
  const uint32_t qw[4] = {q4.x, q4.y, q4.z, q4.w};
  const float d = h2f(ld16(row + 16 * nb + 2 * c));
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int byte = static_cast<int>(byte_of(qw, j));
    out[j] = ((byte & 0xF) - 8) * d;
    out[j + 16] = ((byte >> 4) - 8) * d;
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::Q4_1>(const uint8_t* row, int64_t c, int64_t nb, float* out) {
  const uint4 q4 = reinterpret_cast<const uint4*>(row)[c];
  const uint32_t qw[4] = {q4.x, q4.y, q4.z, q4.w};
  const uint32_t dm = *reinterpret_cast<const uint32_t*>(row + 16 * nb + 4 * c);
  const float d = h2f(static_cast<uint16_t>(dm & 0xFFFF)), m = h2f(static_cast<uint16_t>(dm >> 16));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t q = qw[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t byte = (q >> (8 * j)) & 0xFF;
      out[4 * i + j] = (byte & 0xF) * d + m;
      out[4 * i + j + 16] = (byte >> 4) * d + m;
    }
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::Q8_0>(const uint8_t* row, int64_t c, int64_t nb, float* out) {
  const uint4 lo = reinterpret_cast<const uint4*>(row)[c], hi = reinterpret_cast<const uint4*>(row)[nb + c];
  const uint32_t qw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const float d = h2f(ld16(row + 32 * nb + 2 * c));
#pragma unroll
  for (int j = 0; j < 32; ++j) out[j] = static_cast<int8_t>(byte_of(qw, j)) * d;
}
__device__ __forceinline__ void q5_decode(const uint8_t* qs, const uint8_t* qh_bytes, int* q) {
  const uint32_t qh = ld16(qh_bytes) | (static_cast<uint32_t>(ld16(qh_bytes + 2)) << 16);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
    q[j + 16] = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::Q5_0>(const uint8_t* row, int64_t c, int64_t nb, float* out) {
  int q[32];
  q5_decode(row + 16 * c, row + 16 * nb + 4 * c, q);
  const float d = h2f(ld16(row + 20 * nb + 2 * c));
#pragma unroll
  for (int j = 0; j < 32; ++j) out[j] = (q[j] - 16) * d;
}
template <>
__device__ __forceinline__ void dequant32<DType::Q5_1>(const uint8_t* row, int64_t c, int64_t nb, float* out) {
  int q[32];
  q5_decode(row + 16 * c, row + 16 * nb + 4 * c, q);
  const uint8_t* dm = row + 20 * nb + 4 * c;
  const float d = h2f(ld16(dm)), m = h2f(ld16(dm + 2));
#pragma unroll
  for (int j = 0; j < 32; ++j) out[j] = q[j] * d + m;
}
// The 16-byte header of a Q4_K/Q5_K super-block (d, dmin, then 12 bytes of 6-bit scales
// and mins) in one 16-byte load: the eight sub-blocks of a super-block (eight lanes of a
// GEMV warp) share it, where byte loads took one load instruction per scale byte.
struct KHeader {
  uint32_t dm;    // d (low half), dmin (high half), f16
  uint32_t q[3];  // the scale bytes
};
__device__ __forceinline__ KHeader k_header(const uint8_t* b) {
  const uint4 h = *reinterpret_cast<const uint4*>(b);
  return KHeader{h.x, {h.y, h.z, h.w}};
}
// 6-bit scale and min of sub-block j (0..7) from the header's scale bytes.
__device__ __forceinline__ void k_scale_min_dev(int j, const KHeader& h, float* sc, float* m) {
  const auto q = [&](int i) { return (h.q[i >> 2] >> (8 * (i & 3))) & 0xFF; };
  if (j < 4) {
    *sc = q(j) & 63;
    *m = q(j + 4) & 63;
  } else {
    *sc = (q(j + 4) & 0xF) | ((q(j - 4) >> 6) << 4);
    *m = (q(j + 4) >> 4) | ((q(j) >> 6) << 4);
  }
}
// Q4_K and Q5_K super-blocks (144 and 176 bytes) keep 16-byte alignment from an aligned
// row, so their quant bytes come in 16-byte loads (rows are, on the device and in the
// tests); Q6_K's rows are split for that (layout.h).
template <>
__device__ __forceinline__ void dequant32<DType::Q4_K>(const uint8_t* row, int64_t c, int64_t /*nb*/, float* out) {
  const uint8_t* b = row + (c >> 3) * 144;
  const int sub = static_cast<int>(c & 7);
  const KHeader h = k_header(b);
  const float d = h2f(static_cast<uint16_t>(h.dm & 0xFFFF)), dmin = h2f(static_cast<uint16_t>(h.dm >> 16));
  float sc, m;
  k_scale_min_dev(sub, h, &sc, &m);
  const float d1 = d * sc, m1 = dmin * m;
  uint32_t qw[8];
  ld32x8(b + 16 + 32 * (sub >> 1), qw);
  const int shift = (sub & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) out[l] = d1 * ((byte_of(qw, l) >> shift) & 0xF) - m1;
}
template <>
__device__ __forceinline__ void dequant32<DType::Q5_K>(const uint8_t* row, int64_t c, int64_t /*nb*/, float* out) {
  const uint8_t* b = row + (c >> 3) * 176;
  const int sub = static_cast<int>(c & 7);
  const KHeader h = k_header(b);
  const float d = h2f(static_cast<uint16_t>(h.dm & 0xFFFF)), dmin = h2f(static_cast<uint16_t>(h.dm >> 16));
  float sc, m;
  k_scale_min_dev(sub, h, &sc, &m);
  const float d1 = d * sc, m1 = dmin * m;
  uint32_t hw[8], qw[8];
  ld32x8(b + 16, hw);
  ld32x8(b + 48 + 32 * (sub >> 1), qw);
  const int shift = (sub & 1) * 4;
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const int v =
        static_cast<int>((byte_of(qw, l) >> shift) & 0xF) + static_cast<int>((byte_of(hw, l) >> sub) & 1) * 16;
    out[l] = d1 * v - m1;
  }
}
template <>
__device__ __forceinline__ void dequant32<DType::Q6_K>(const uint8_t* row, int64_t c, int64_t nb, float* out) {
  // Split rows (layout.h): super-block sb's 192 quant bytes at 192 sb, its 16 scales at
  // 192 nsb + 16 sb, its d at 208 nsb + 2 sb.
  const int64_t nsb = nb >> 3, sb = c >> 3;
  const uint8_t* b = row + sb * 192;
  const int rem = static_cast<int>(c & 7), half = rem >> 2, k = rem & 3;
  const uint8_t* ql = b + 64 * half + ((k & 1) ? 32 : 0);
  const uint8_t* qh = b + 128 + 32 * half;
  const int8_t* scales = reinterpret_cast<const int8_t*>(row + 192 * nsb + 16 * sb) + 8 * half;
  const float d = h2f(ld16(row + 208 * nsb + 2 * sb));
  const float s0 = d * scales[2 * k], s1 = d * scales[1 + 2 * k];
  const int lshift = (k >> 1) * 4, hshift = 2 * k;
  uint32_t lw[8], hw[8];
  ld32x8(ql, lw);
  ld32x8(qh, hw);
#pragma unroll
  for (int l = 0; l < 32; ++l) {
    const uint32_t lo = byte_of(lw, l), hi = byte_of(hw, l);
    const int q = static_cast<int>(((lo >> lshift) & 0xF) | (((hi >> hshift) & 3) << 4)) - 32;
    out[l] = (l < 16 ? s0 : s1) * q;
  }
}

// A K or V value as the f16 cache stores it (kernels/fp16.h: f32_to_f16_kv, the CPU
// backend's): rounded to nearest even, NaN stored as 0, values beyond the f16 range
// saturated to +-65504, so the cache holds no Inf or NaN that a masked key's zero weight
// could turn into NaN in the tile kernels' P V.
__device__ __forceinline__ __half kv_half(float v) {
  v = isnan(v) ? 0.0f : fminf(fmaxf(v, -65504.0f), 65504.0f);
  return __float2half_rn(v);
}

// f32 rows -> f16/bf16 rows, for the cuBLAS and tensor-core matmuls: x [n, ldx] (the first
// cols values of each row) -> out [n_pad, ld_out], zero past cols and past row n. With kVec
// (ldx, cols and ld_out multiples of 4, x 16-byte and out 8-byte aligned: to_half_rows()
// checks) a thread converts four adjacent values, one 16-byte load and one 8-byte store;
// each value is rounded alone (to nearest even), so the bits are the same either way.
template <typename H>
__device__ __forceinline__ H round_to(float v) {
  if constexpr (std::is_same_v<H, __half>)
    return __float2half_rn(v);
  else
    return __float2bfloat16_rn(v);
}
// Stores v at xh's element i (HalfOut, ops.h), rounded as to_half_rows() rounds.
__device__ __forceinline__ void store_half(HalfOut xh, int64_t i, float v) {
  if (xh.bf16)
    static_cast<__nv_bfloat16*>(xh.p)[i] = round_to<__nv_bfloat16>(v);
  else
    static_cast<__half*>(xh.p)[i] = round_to<__half>(v);
}
template <typename H>
struct alignas(8) Half4 {
  H v[4];
};
template <typename H, bool kVec>
__global__ void to_half_rows_kernel(const float* __restrict__ x, int64_t ldx, int64_t n, int64_t cols, int64_t ld_out,
                                    int64_t n_pad, H* __restrict__ out) {
  constexpr int kE = kVec ? 4 : 1;
  const int64_t per_row = ld_out / kE;
  const int64_t total = n_pad * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / per_row, k = (i % per_row) * kE;
    const bool in = t < n && k < cols;  // (kVec: cols % 4 == 0, so k + 3 < cols too)
    if constexpr (kVec) {
      const float4 f = in ? *reinterpret_cast<const float4*>(x + t * ldx + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      Half4<H> h;
      h.v[0] = round_to<H>(f.x);
      h.v[1] = round_to<H>(f.y);
      h.v[2] = round_to<H>(f.z);
      h.v[3] = round_to<H>(f.w);
      *reinterpret_cast<Half4<H>*>(out + t * ld_out + k) = h;
    } else {
      out[i] = round_to<H>(in ? x[t * ldx + k] : 0.0f);
    }
  }
}

// Attention's keys come in segments of kAttentionSegment positions (ops.h): each segment's
// partial (running max m, sum l, unnormalised output acc) is merged with merge_step in
// segment order, by every attention kernel that does so (attention.cu's looped and
// split-KV paths, attention_tc.cu's batch-invariant one), so they agree bit for bit
// however their work is cut into blocks.
// (m, l, acc) merged with a segment's partial (pm, pl, pacc); explicit rounding, so no
// kernel contracts it differently.
__device__ __forceinline__ void merge_step(float& m, float& l, float& acc, float pm, float pl, float pacc) {
  const float mn = fmaxf(m, pm);
  const float fr = expf(__fsub_rn(m, mn)), fp = expf(__fsub_rn(pm, mn));
  l = __fmaf_rn(l, fr, __fmul_rn(pl, fp));
  acc = __fmaf_rn(acc, fr, __fmul_rn(pacc, fp));
  m = mn;
}

// Whether the tensor-core prefill attention (attention_tc.cu) takes tile `tile` of the
// step (tokens 16 tile .. 16 tile + 15): all its tokens are of one sequence. The per-token
// kernel (attention.cu) asks the same question to skip those tokens when both run.
__device__ __forceinline__ bool tc_tile_uniform(const int32_t* token_seq, int32_t num_tokens, int tile) {
  const int t0 = tile * 16;
  const int t1 = t0 + 15 < num_tokens - 1 ? t0 + 15 : num_tokens - 1;
  return token_seq[t0] == token_seq[t1];
}

// The token groups of every GEMV launch: f.template operator()<NT>(groups) with NT = 1, 2
// or 4 for up to 4 tokens (one group), else NT = 8 and ceil(n / 8) groups (grid y). A
// token's bits depend on neither.
template <typename F>
__host__ void with_token_groups(int64_t n, F&& f) {
  if (n == 1)
    f.template operator()<1>(1u);
  else if (n == 2)
    f.template operator()<2>(1u);
  else if (n <= 4)
    f.template operator()<4>(1u);
  else
    f.template operator()<8>(static_cast<unsigned>((n + 7) / 8));
}

// Calls f.template operator()<T>() for the runtime type; false when unsupported.
template <typename F>
__host__ bool dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      f.template operator()<DType::F32>();
      return true;
    case DType::F16:
      f.template operator()<DType::F16>();
      return true;
    case DType::BF16:
      f.template operator()<DType::BF16>();
      return true;
    case DType::Q4_0:
      f.template operator()<DType::Q4_0>();
      return true;
    case DType::Q4_1:
      f.template operator()<DType::Q4_1>();
      return true;
    case DType::Q5_0:
      f.template operator()<DType::Q5_0>();
      return true;
    case DType::Q5_1:
      f.template operator()<DType::Q5_1>();
      return true;
    case DType::Q8_0:
      f.template operator()<DType::Q8_0>();
      return true;
    case DType::Q4_K:
      f.template operator()<DType::Q4_K>();
      return true;
    case DType::Q5_K:
      f.template operator()<DType::Q5_K>();
      return true;
    case DType::Q6_K:
      f.template operator()<DType::Q6_K>();
      return true;
    default:
      return false;
  }
}

// The blocks a launch needs across the heads when a block takes up to per_block query heads
// of one KV head (the heads of a GQA group share its K/V loads).
__host__ inline unsigned gqa_head_blocks(int32_t num_heads, int32_t num_kv_heads, int per_block) {
  const int group = num_heads / num_kv_heads;
  return static_cast<unsigned>(num_kv_heads * ((group + per_block - 1) / per_block));
}

#if !defined(TROUPE_CUDA_EMULATION) || defined(TROUPE_CUDA_HOSTRUN)  // (with the launchers)
// Lets `kernel` take `bytes` of dynamic shared memory (past the default 48 KB) on the current
// device, once per device: `opted` is the caller's record (a static per kernel instance), so
// neither every launch nor one being captured into a graph asks the runtime again.
inline cudaError_t opt_in_shared_memory(const void* kernel, size_t bytes, std::atomic<uint64_t>& opted) {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (opted.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) opted.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}
#endif

}  // namespace troupe::cuda
