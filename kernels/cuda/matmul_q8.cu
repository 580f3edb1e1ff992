// GEMV of the quantized types against activations quantized to int8 per 32 values, as
// GGML's q8_0/q8_1 (and the CPU backend) do: id = 127 / amax, round half to even, d kept as
// f16 for the 32-block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and s = d * sum(q) (as f16 for
// the types with a min, Q4_1 and Q5_1). Integer dot products with __dp4a; per 32 values the
// float combine is (d_w * d_x) * isum + m_w * s_x, so for the 32-block types logits agree
// with the CPU and llama.cpp on the same file. The K-quants take the same path per
// 32-value sub-block with their own numerics (within about 1% of the exact product, as the
// CPU's; not its bits): activations with d and s in f32, Q4_K and Q5_K as d_w = d * scale
// and m_w = -dmin * min in f32 (the CPU rounds these to f16), Q6_K with its two 16-value
// scales inside the integer sum (isum = scale_a * isum_a + scale_b * isum_b, exact) and
// d_w = d (the CPU quantizes its activations per 256 values, as GGML's q8_K). A token's
// arithmetic does not depend on its batch (batch-invariant).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_epilogue.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quantize_q8.cuh"

namespace troupe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// One token's quantized activations (ops.h: q8_row_bytes): block b's first 16 values at
// 16 b, its last 16 at 16 (nb + b), d at float 8 nb + b, s at float 9 nb + b.
struct Q8Row {
  const uint8_t* p;
  int64_t nb;
  __device__ int4 lo(int64_t b) const { return reinterpret_cast<const int4*>(p)[b]; }
  __device__ int4 hi(int64_t b) const { return reinterpret_cast<const int4*>(p)[nb + b]; }
  __device__ float d(int64_t b) const { return reinterpret_cast<const float*>(p)[8 * nb + b]; }
  __device__ float s(int64_t b) const { return reinterpret_cast<const float*>(p)[9 * nb + b]; }
};

// One warp per (token, 32-block group): lane j quantizes element j of the block.
__global__ void quantize_q8_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, int64_t n, Q8Numerics nq,
                                   uint8_t* __restrict__ out) {
  const int64_t nb = cols / 32;
  const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= n * nb) return;
  const int64_t t = warp / nb, b = warp % nb;
  quantize_q8_block(x[t * ldx + b * 32 + lane], lane, b, nb, out + t * static_cast<int64_t>(q8_row_bytes(cols)), nq);
}

constexpr bool is_k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }

// 32-value block j of a device row (kernels/cuda/layout.h) of nb blocks as 8 words of 4
// signed/unsigned bytes in element order, plus d and m; for Q6_K also the two 16-value
// scales (sc[0] for words 0-3, sc[1] for 4-7). The 32-value types' rows are split: block j's
// quants at 16 j in one 16-byte load (Q8_0: its last 16 at 16 (nb + j), a second), its high
// bits and scales in their own sections, so a warp's loads of them are contiguous.
template <DType T>
__device__ __forceinline__ void unpack_block(const uint8_t* row, int64_t j, int64_t nb, int32_t* v, float* d, float* m,
                                             int* sc);

// Low nibbles of the 16 quant bytes to words 0-3, high nibbles to words 4-7.
__device__ __forceinline__ void nibble_words(const uint4& q, int32_t* v) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = static_cast<int32_t>(w[i] & 0x0F0F0F0Fu);
    v[i + 4] = static_cast<int32_t>((w[i] >> 4) & 0x0F0F0F0Fu);
  }
}
__device__ __forceinline__ uint4 quants16(const uint8_t* row, int64_t j) {
  return reinterpret_cast<const uint4*>(row)[j];
}

template <>
__device__ __forceinline__ void unpack_block<DType::Q4_0>(const uint8_t* row, int64_t j, int64_t nb, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  *d = h2f(ld16(row + 16 * nb + 2 * j));
  *m = -8.0f * *d;
  nibble_words(quants16(row, j), v);
}
template <>
__device__ __forceinline__ void unpack_block<DType::Q4_1>(const uint8_t* row, int64_t j, int64_t nb, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  const uint32_t dm = *reinterpret_cast<const uint32_t*>(row + 16 * nb + 4 * j);
  *d = h2f(static_cast<uint16_t>(dm & 0xFFFF));
  *m = h2f(static_cast<uint16_t>(dm >> 16));
  nibble_words(quants16(row, j), v);
}
// Bits 0-3 of x to bit 4 of bytes 0-3.
__device__ __forceinline__ uint32_t spread4(uint32_t x) {
  return ((x & 1u) | ((x & 2u) << 7) | ((x & 4u) << 14) | ((x & 8u) << 21)) << 4;
}
__device__ __forceinline__ void q5_words(const uint4& q, uint32_t qh, int32_t* v) {
  const uint32_t qs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = static_cast<int32_t>((qs[i] & 0x0F0F0F0Fu) | spread4(qh >> (4 * i)));
    v[i + 4] = static_cast<int32_t>(((qs[i] >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (4 * i + 16)));
  }
}
template <>
__device__ __forceinline__ void unpack_block<DType::Q5_0>(const uint8_t* row, int64_t j, int64_t nb, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  *d = h2f(ld16(row + 20 * nb + 2 * j));
  *m = -16.0f * *d;
  q5_words(quants16(row, j), *reinterpret_cast<const uint32_t*>(row + 16 * nb + 4 * j), v);
}
template <>
__device__ __forceinline__ void unpack_block<DType::Q5_1>(const uint8_t* row, int64_t j, int64_t nb, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  const uint32_t dm = *reinterpret_cast<const uint32_t*>(row + 20 * nb + 4 * j);
  *d = h2f(static_cast<uint16_t>(dm & 0xFFFF));
  *m = h2f(static_cast<uint16_t>(dm >> 16));
  q5_words(quants16(row, j), *reinterpret_cast<const uint32_t*>(row + 16 * nb + 4 * j), v);
}
template <>
__device__ __forceinline__ void unpack_block<DType::Q8_0>(const uint8_t* row, int64_t j, int64_t nb, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  *d = h2f(ld16(row + 32 * nb + 2 * j));
  *m = 0.0f;
  const uint4 lo = quants16(row, j), hi = quants16(row, nb + j);  // (the first 16 quants, then the last)
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = static_cast<int32_t>(w[i]);
}

// d * scale and -dmin * min of sub-block `sub` of the Q4_K/Q5_K super-block at b.
__device__ __forceinline__ void k_sub_scales(const uint8_t* b, int sub, float* d, float* m) {
  const KHeader h = k_header(b);
  float sc, mn;
  k_scale_min_dev(sub, h, &sc, &mn);
  *d = __fmul_rn(h2f(static_cast<uint16_t>(h.dm & 0xFFFF)), sc);
  *m = -__fmul_rn(h2f(static_cast<uint16_t>(h.dm >> 16)), mn);
}

// Sub-block j & 7 of super-block j >> 3. Q4_K/Q5_K super-blocks (144, 176 bytes) keep the
// row's 16-byte alignment; Q6_K's rows are split (quants, scales, d) for it.
template <>
__device__ __forceinline__ void unpack_block<DType::Q4_K>(const uint8_t* row, int64_t j, int64_t /*nb*/, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  const uint8_t* b = row + (j >> 3) * 144;
  const int sub = static_cast<int>(j & 7);
  k_sub_scales(b, sub, d, m);
  uint32_t qw[8];
  ld32x8(b + 16 + 32 * (sub >> 1), qw);
  const int shift = (sub & 1) * 4;
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = static_cast<int32_t>((qw[i] >> shift) & 0x0F0F0F0Fu);
}
template <>
__device__ __forceinline__ void unpack_block<DType::Q5_K>(const uint8_t* row, int64_t j, int64_t /*nb*/, int32_t* v,
                                                          float* d, float* m, int* /*sc*/) {
  const uint8_t* b = row + (j >> 3) * 176;
  const int sub = static_cast<int>(j & 7);
  k_sub_scales(b, sub, d, m);
  uint32_t hw[8], qw[8];
  ld32x8(b + 16, hw);
  ld32x8(b + 48 + 32 * (sub >> 1), qw);
  const int shift = (sub & 1) * 4;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    v[i] = static_cast<int32_t>(((qw[i] >> shift) & 0x0F0F0F0Fu) | (((hw[i] >> sub) & 0x01010101u) << 4));
}
template <>
__device__ __forceinline__ void unpack_block<DType::Q6_K>(const uint8_t* row, int64_t j, int64_t nb, int32_t* v,
                                                          float* d, float* m, int* sc) {
  const int64_t nsb = nb >> 3, sb = j >> 3;  // (split rows: quants, scales, d; layout.h)
  const uint8_t* b = row + sb * 192;
  const int rem = static_cast<int>(j & 7), half = rem >> 2, k = rem & 3;
  const uint8_t* ql = b + 64 * half + ((k & 1) ? 32 : 0);
  const uint8_t* qh = b + 128 + 32 * half;
  const uint16_t s01 = ld16(row + 192 * nsb + 16 * sb + 8 * half + 2 * k);
  sc[0] = static_cast<int8_t>(s01 & 0xFF);
  sc[1] = static_cast<int8_t>(s01 >> 8);
  *d = h2f(ld16(row + 208 * nsb + 2 * sb));
  *m = 0.0f;
  const int lshift = (k >> 1) * 4, hshift = 2 * k;
  uint32_t lw[8], hw[8];
  ld32x8(ql, lw);
  ld32x8(qh, hw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = lw[i], hi = hw[i];
    // q = 0..63 per byte; q - 32 as a signed byte is the 6-bit value q ^ 32 sign-extended.
    const uint32_t x = (((lo >> lshift) & 0x0F0F0F0Fu) | (((hi >> hshift) & 0x03030303u) << 4)) ^ 0x20202020u;
    v[i] = static_cast<int32_t>((x & 0x1F1F1F1Fu) | ((x & 0x20202020u) * 7u));
  }
}

// R rows per warp, so each activation block a lane loads (48 bytes per token) serves R
// weight blocks (20-34 bytes each): with one row per warp the activations' traffic was
// 1.4-2.4 times the weights' at one token and NT times that at NT. Lane l takes blocks l,
// l + 32, ... of each of its rows in order; the per-block combine is written with explicit
// rounding intrinsics, so the compiler cannot contract it differently for another R or NT:
// a (row, token)'s bits depend on neither R nor NT nor the batch. The R rows are R / E::kRows
// items of the epilogue E (gemv_epilogue.cuh: plain rows, or a fused SiLU or RoPE + KV
// write, or the SiLU quantized for the down matmul, whose finish() follows the stores); items
// past the end re-read the warp's first item and are not stored.
template <DType T, int NT, int R, class E>
__device__ __forceinline__ void gemv_q8_warp(const uint8_t* __restrict__ w, size_t row_bytes, int64_t nb,
                                             const uint8_t* __restrict__ xq, int64_t n, const E& out) {
  constexpr int K = E::kRows, P = R / K;
  static_assert(R % K == 0, "whole items per warp");
  const int lane = threadIdx.x & 31;
  const int64_t item0 = (int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5)) * P;
  const int64_t items = out.items();
  if (item0 >= items) return;
  const int np = items - item0 < P ? static_cast<int>(items - item0) : P;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n - t0 < NT ? static_cast<int>(n - t0) : NT;
  const int64_t xstride = static_cast<int64_t>(q8_row_bytes(nb * 32));
  xq += t0 * xstride;
  const uint8_t* wr[R];
#pragma unroll
  for (int i = 0; i < R; ++i)
    wr[i] = w + static_cast<size_t>(out.row(item0 + (i / K < np ? i / K : 0), i % K)) * row_bytes;
  float acc[R][NT];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[i][t] = 0.f;
  for (int64_t b = lane; b < nb; b += 32) {
    int32_t v[R][8];
    float d[R], m[R];
    int sc[R][2];
#pragma unroll
    for (int i = 0; i < R; ++i) unpack_block<T>(wr[i], b, nb, v[i], &d[i], &m[i], sc[i]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      const Q8Row xr{xq + t * xstride, nb};
      const int4 q0 = xr.lo(b), q1 = xr.hi(b);
      const float xd = xr.d(b), xs = xr.s(b);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        int isum = 0;
        isum = __dp4a(v[i][0], q0.x, isum);
        isum = __dp4a(v[i][1], q0.y, isum);
        isum = __dp4a(v[i][2], q0.z, isum);
        isum = __dp4a(v[i][3], q0.w, isum);
        if constexpr (T == DType::Q6_K) {  // the first 16 values' scale, then the second's
          int hsum = 0;
          hsum = __dp4a(v[i][4], q1.x, hsum);
          hsum = __dp4a(v[i][5], q1.y, hsum);
          hsum = __dp4a(v[i][6], q1.z, hsum);
          hsum = __dp4a(v[i][7], q1.w, hsum);
          isum = isum * sc[i][0] + hsum * sc[i][1];
        } else {
          isum = __dp4a(v[i][4], q1.x, isum);
          isum = __dp4a(v[i][5], q1.y, isum);
          isum = __dp4a(v[i][6], q1.z, isum);
          isum = __dp4a(v[i][7], q1.w, isum);
        }
        // (d * xd) * isum + m * xs, the product fused into the add, then added to acc
        acc[i][t] = __fadd_rn(acc[i][t], __fmaf_rn(__fmul_rn(d[i], xd), static_cast<float>(isum), __fmul_rn(m[i], xs)));
      }
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (p >= np) break;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      float s[K];
#pragma unroll
      for (int k = 0; k < K; ++k) s[k] = warp_sum(acc[p * K + k][t]);
      if (lane == 0) out.store(t0 + t, item0 + p, s);
    }
  }
}

template <DType T, int NT, int R, class E = RowsOut>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_q8_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t nb, const uint8_t* __restrict__ xq,
                   int64_t n, E out) {
  gemv_q8_warp<T, NT, R>(w, row_bytes, nb, xq, n, out);
  if constexpr (E::kBlockFinish) {
    constexpr int per_block = kWarpsPerBlock * (R / E::kRows);
    static_assert(32 % per_block == 0, "a block's items lie in one 32-value block");
    out.finish(n, NT, per_block);
  }
}

// ---- many tokens: the GEMV's sums on tensor cores ------------------------------------------
// The int8 sums of a 32-value block are integers, so mma.sync (m16n8k32, s8 x s8 -> s32:
// exactly one block of 16 rows x 8 tokens) gives the very isum the GEMV's __dp4a chain gives.
// The kernel then repeats the GEMV's float arithmetic to the bit: per (row, token), lane
// class l of the GEMV (blocks l, l + 32, ...) is accumulated here as acc = 0, acc += the
// block's (d_w d_x) isum + m_w s_x in the same order with the same intrinsics, and the 32
// class sums are added as warp_sum adds them -- its xor butterfly (16, 8, 4, 2, 1) is the
// balanced pairwise tree over the classes in bit-reversed order (0, 16, 8, 24, ...), which a
// five-deep stack folds as each class ends. So a token's outputs are the GEMV's bits
// whichever kernel runs and whatever its batch: batch-invariant, and the backend may switch
// kernels by token count (gemv_q8's mma_min_tokens). Weights are read once per 64 tokens
// (a block: 16 rows x 64 tokens, a warp 16 tokens as two 16 x 8 tiles) instead of once per
// 8. sm_80+ (the build's architectures are 80 and 90; older ones trap).
constexpr int kMmaWarps = 4;
constexpr int kMmaTokens = 16;  // per warp

// D += A B for A 16 x 32 (row-major, s8), B 32 x 8 (column-major, s8), D 16 x 8 (s32), per
// thread (g = lane / 4, q = lane % 4): a = {A[g][4q..], A[g+8][4q..], A[g][16+4q..],
// A[g+8][16+4q..]}, b = {B[4q..][g], B[16+4q..][g]} (4 bytes each), d = {D[g][2q],
// D[g][2q+1], D[g+8][2q], D[g+8][2q+1]}. (cuda_emulation.h: the same on the CPU.)
__device__ __forceinline__ void mma_s8_16x8x32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
#if defined(TROUPE_CUDA_EMULATION)
  cuda_emu::mma_s8_16x8x32(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Words q and 4 + q of a block's unpacked values (values 4q.. and 16 + 4q..), without a
// dynamically indexed array.
__device__ __forceinline__ void pick_words(const int32_t* v, int q, int* lo, int* hi) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i == q) {
      *lo = v[i];
      *hi = v[i + 4];
    }
}

template <DType T>
__global__ void __launch_bounds__(kMmaWarps * 32)
    gemm_q8_mma_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t nb,
                       const uint8_t* __restrict__ xq, int64_t n, float* __restrict__ y, int64_t ldy) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = int64_t{blockIdx.x} * 16;
  const int64_t tw = (int64_t{blockIdx.y} * kMmaWarps + (threadIdx.x >> 5)) * kMmaTokens;  // the warp's first token
  if (tw >= n) return;                                                                     // (warp-uniform)
  const int64_t xstride = static_cast<int64_t>(q8_row_bytes(nb * 32));
  // This thread's A rows (g, g + 8) and B tokens (tw + g, tw + 8 + g); rows and tokens past
  // the end read row r0 and token tw and are not stored.
  const uint8_t* wr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) wr[h] = w + static_cast<size_t>(r0 + g + 8 * h < rows ? r0 + g + 8 * h : r0) * row_bytes;
  const int* xb[2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
    xb[j] = reinterpret_cast<const int*>(xq + (tw + 8 * j + g < n ? tw + 8 * j + g : tw) * xstride);
  // The tokens of this thread's outputs: tw + 8 j + 2 q + e.
  const float* xsc[2][2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t t = tw + 8 * j + 2 * q + e;
      xsc[j][e] = reinterpret_cast<const float*>(xq + (t < n ? t : tw) * xstride);
    }
  // Outputs: [tile j][e]: row g + 8 (e >> 1), token tw + 8 j + 2 q + (e & 1).
  float stack[5][2][4];
  float total[2][4];
#pragma unroll 1
  for (int ci = 0; ci < 32; ++ci) {
    const int cls = ((ci & 1) << 4) | ((ci & 2) << 2) | (ci & 4) | ((ci & 8) >> 2) | ((ci & 16) >> 4);  // bit-reversed
    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    for (int64_t b = cls; b < nb; b += 32) {
      int a[4], a_hi[4];  // (Q6_K: the block's two 16-value halves as two products)
      float d[2], m[2];
      int sc[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int32_t v[8];
        unpack_block<T>(wr[h], b, nb, v, &d[h], &m[h], sc[h]);
        pick_words(v, q, &a[h], &a[2 + h]);
      }
      if constexpr (T == DType::Q6_K) {
        a_hi[0] = 0;
        a_hi[1] = 0;
        a_hi[2] = a[2];
        a_hi[3] = a[3];
        a[2] = 0;
        a[3] = 0;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int bw[2] = {xb[j][4 * b + q], xb[j][4 * (nb + b) + q]};
        int c[4] = {0, 0, 0, 0};
        mma_s8_16x8x32(c, a, bw);
        if constexpr (T == DType::Q6_K) {  // isum = scale_a * isum_a + scale_b * isum_b, as the GEMV
          int c_hi[4] = {0, 0, 0, 0};
          mma_s8_16x8x32(c_hi, a_hi, bw);
#pragma unroll
          for (int e = 0; e < 4; ++e) c[e] = c[e] * sc[e >> 1][0] + c_hi[e] * sc[e >> 1][1];
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float* xr = xsc[j][e & 1];
          const float xd = xr[8 * nb + b], xs = xr[9 * nb + b];
          const int h = e >> 1;
          acc[j][e] =
              __fadd_rn(acc[j][e], __fmaf_rn(__fmul_rn(d[h], xd), static_cast<float>(c[e]), __fmul_rn(m[h], xs)));
        }
      }
    }
    // Fold the class into the pairwise tree: level k holds a finished subtree of 2^k
    // classes; class ci completes its trailing-ones count of them (all five at ci = 31).
    // (Static indices only, so the levels stay in registers.)
    const int done = __ffs(~ci) - 1;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = acc[j][e];
#pragma unroll
        for (int k = 0; k < 5; ++k)
          if (k < done) v = __fadd_rn(stack[k][j][e], v);
#pragma unroll
        for (int k = 0; k < 5; ++k)
          if (k == done) stack[k][j][e] = v;
        if (done == 5) total[j][e] = v;
      }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t r = r0 + g + 8 * (e >> 1), t = tw + 8 * j + 2 * q + (e & 1);
      if (r < rows && t < n) y[t * ldy + r] = total[j][e];
    }
}

// Rows per warp by the weight's shape alone (never by batch): several where there are
// enough rows to keep every multiprocessor busy with them, else one.
constexpr int kQ8RowsPerWarp = 4;
constexpr int64_t kQ8MultiRowMin = 4096;

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
template <DType T, int R, class E>
void launch_rows(const uint8_t* w, size_t row_bytes, int64_t nb, const uint8_t* xq, int64_t n, const E& out,
                 cudaStream_t stream) {
  constexpr int64_t per_block = int64_t{kWarpsPerBlock} * (R / E::kRows);
  const unsigned blocks = static_cast<unsigned>((out.items() + per_block - 1) / per_block);
  const dim3 block(kWarpsPerBlock * 32);
  with_token_groups(n, [&]<int NT>(unsigned groups) {
    gemv_q8_kernel<T, NT, R, E><<<dim3(blocks, groups), block, 0, stream>>>(w, row_bytes, nb, xq, n, out);
  });
}

// Plain rows: kQ8RowsPerWarp a warp for large weights; the SiLU epilogue: two gate/up pairs
// a warp there (the same rows a warp), else one; RoPE + KV write: one pair a warp (QKV
// weights are small).
template <DType T, class E>
void launch(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t nb, const uint8_t* xq, int64_t n, const E& out,
            cudaStream_t stream) {
  if constexpr (std::is_same_v<E, RopeKvOut>) {
    launch_rows<T, 2>(w, row_bytes, nb, xq, n, out, stream);
  } else {
    constexpr int kMin = E::kRows;  // one item a warp
    if (rows >= kQ8MultiRowMin)
      launch_rows<T, kQ8RowsPerWarp>(w, row_bytes, nb, xq, n, out, stream);
    else
      launch_rows<T, kMin>(w, row_bytes, nb, xq, n, out, stream);
  }
}

constexpr bool has_q8_kernels(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0 ||
         is_k_quant(t);
}
// Calls f.template operator()<T>() for the weight type; false when it has no int8 kernels.
template <class F>
bool with_q8_type(DType type, F&& f) {
  return has_q8_kernels(type) && dispatch_dtype(type, [&]<DType T>() {
           if constexpr (has_q8_kernels(T)) f.template operator()<T>();
         });
}

// Calls launch<T>() for the weight type; false when it has no int8 GEMV.
template <class E>
bool dispatch(DType type, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t nb, const uint8_t* xq, int64_t n,
              const E& out, cudaStream_t stream) {
  return with_q8_type(type, [&]<DType T>() { launch<T>(w, row_bytes, rows, nb, xq, n, out, stream); });
}

// The tensor-core kernel for the weight type; false when it has none.
bool dispatch_mma(DType type, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t nb, const uint8_t* xq,
                  int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  constexpr int64_t per_block = int64_t{kMmaWarps} * kMmaTokens;
  const dim3 grid(static_cast<unsigned>((rows + 15) / 16), static_cast<unsigned>((n + per_block - 1) / per_block));
  return with_q8_type(type, [&]<DType T>() {
    gemm_q8_mma_kernel<T><<<grid, kMmaWarps * 32, 0, stream>>>(w, row_bytes, rows, nb, xq, n, y, ldy);
  });
}
#endif

}  // namespace

#ifndef TROUPE_CUDA_EMULATION
bool uses_q8_activations(DType type) { return has_q8_kernels(type); }

cudaError_t quantize_q8(DType weight_type, const float* x, int64_t ldx, int64_t cols, int64_t n, uint8_t* out,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (cols % 32 != 0) return cudaErrorInvalidValue;
  const int64_t warps = n * (cols / 32);
  quantize_q8_kernel<<<static_cast<unsigned>((warps + 7) / 8), 256, 0, stream>>>(x, ldx, cols, n,
                                                                                 q8_numerics(weight_type), out);
  return cudaGetLastError();
}

cudaError_t gemv_q8(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const uint8_t* xq,
                    int64_t n, float* y, int64_t ldy, cudaStream_t stream, int64_t mma_min_tokens) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  if (mma_min_tokens > 0 && n >= mma_min_tokens) {
    if (n > int64_t{65535} * kMmaWarps * kMmaTokens) return cudaErrorInvalidValue;
    if (!dispatch_mma(type, static_cast<const uint8_t*>(w), row_bytes, rows, cols / 32, xq, n, y, ldy, stream))
      return cudaErrorInvalidValue;
    return cudaGetLastError();
  }
  if (!dispatch(type, static_cast<const uint8_t*>(w), row_bytes, rows, cols / 32, xq, n, RowsOut{y, ldy, rows}, stream))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t gemv_q8_silu(DType type, const void* w, size_t row_bytes, int64_t ffn, int64_t cols, const uint8_t* xq,
                         int64_t n, float* out, int64_t ldo, cudaStream_t stream, const SiluQ8Args& q) {
  if (n <= 0 || ffn <= 0) return cudaSuccess;
  const auto* wb = static_cast<const uint8_t*>(w);
  const SiluOut o{out, ldo, ffn};
  if (q.xq) {
    if (ffn % 32 != 0 || !q.done || q.xq == xq) return cudaErrorInvalidValue;
    if (!dispatch(type, wb, row_bytes, 2 * ffn, cols / 32, xq, n, SiluQ8Out{o, q}, stream))
      return cudaErrorInvalidValue;
  } else if (!dispatch(type, wb, row_bytes, 2 * ffn, cols / 32, xq, n, o, stream)) {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t gemv_q8_rope_kv_write(DType type, const void* w, size_t row_bytes, int64_t cols, const uint8_t* xq,
                                  int64_t n, const RopeKvArgs& args, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t rows = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim;
  if (!dispatch(type, static_cast<const uint8_t*>(w), row_bytes, rows, cols / 32, xq, n, RopeKvOut{args}, stream))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
