// Fused dequantize-GEMV for decode (weights stay quantized on the device, in the layout of
// kernels/cuda/layout.h) and the dequantize-to-f16 pass that feeds cuBLAS for prefill
// (cuda_backend.cpp picks).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_epilogue.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per output row; the block's four warps share tiles of x (1024 columns of up to
// NT tokens) staged in shared memory, padded so that lane l reading its chunk l has no
// bank conflicts. Lane l decodes chunks l, l + 32, ... of the row and dots them with the
// NT token rows (blockIdx.y picks the group of NT tokens), so each weight byte is read once
// per group. A token's arithmetic (chunk order, then the warp sum) does not depend on NT,
// nt or its group: results are batch-invariant, bit for bit.
template <DType T, int NT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                const float* __restrict__ x, int64_t ldx, int64_t n, float* __restrict__ y, int64_t ldy) {
  __shared__ float xs[NT][32 * 33];
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const bool active = r < rows;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n - t0 < NT ? static_cast<int>(n - t0) : NT;
  x += t0 * ldx;
  y += t0 * ldy;
  const uint8_t* row = w + static_cast<size_t>(active ? r : 0) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  const int64_t num_chunks = (cols + 31) / 32;
  float wv[32];
  for (int64_t tile = 0; tile < num_chunks; tile += 32) {
    __syncthreads();
    for (int i = threadIdx.x; i < nt * 1024; i += kWarpsPerBlock * 32) {
      const int t = i >> 10, e = i & 1023;
      const int64_t col = tile * 32 + e;
      xs[t][(e >> 5) * 33 + (e & 31)] = col < cols ? x[t * ldx + col] : 0.f;
    }
    __syncthreads();
    const int64_t c = tile + lane;
    if (!active || c >= num_chunks) continue;
    dequant32<T>(row, c, num_chunks, wv);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      const float* xt = xs[t] + lane * 33;
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j) s = fmaf(wv[j], xt[j], s);
      acc[t] += s;
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= nt) break;
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * ldy + r] = s;
  }
}

// One token, R rows per warp (f32 and the K-quants, the types without a faster kernel):
// the staged x chunk a lane reads from shared memory serves R rows instead of one. Each
// (row, token)'s arithmetic is gemv_kernel's (chunk order, the fmaf chain, the warp sum),
// so the bits are the same.
template <DType T, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                     const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float xs[32 * 33];
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  const bool active = r0 < rows;
  const int nr = !active ? 0 : rows - r0 < R ? static_cast<int>(rows - r0) : R;
  const uint8_t* wr[R];
#pragma unroll
  for (int i = 0; i < R; ++i) wr[i] = w + static_cast<size_t>(active ? r0 + (i < nr ? i : 0) : 0) * row_bytes;
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.f;
  const int64_t num_chunks = (cols + 31) / 32;
  for (int64_t tile = 0; tile < num_chunks; tile += 32) {
    __syncthreads();
    for (int e = threadIdx.x; e < 1024; e += kWarpsPerBlock * 32) {
      const int64_t col = tile * 32 + e;
      xs[(e >> 5) * 33 + (e & 31)] = col < cols ? x[col] : 0.f;
    }
    __syncthreads();
    const int64_t c = tile + lane;
    if (!active || c >= num_chunks) continue;
    float xv[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) xv[j] = xs[lane * 33 + j];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float wv[32];
      dequant32<T>(wr[i], c, num_chunks, wv);
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j) s = fmaf(wv[j], xv[j], s);
      acc[i] += s;
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if (i >= nr) break;
    const float s = warp_sum(acc[i]);
    if (lane == 0) y[r0 + i] = s;
  }
}

// Eight f16/bf16 weights of a 16-byte vector as floats.
template <bool BF16>
__device__ __forceinline__ void unpack8(const uint4& raw, float* wv) {
  const uint32_t ws[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (BF16) {
      wv[2 * j] = __uint_as_float(ws[j] << 16);
      wv[2 * j + 1] = __uint_as_float(ws[j] & 0xFFFF0000u);
    } else {
      wv[2 * j] = h2f(static_cast<uint16_t>(ws[j] & 0xFFFF));
      wv[2 * j + 1] = h2f(static_cast<uint16_t>(ws[j] >> 16));
    }
  }
}

// Activations [base, base + 8) of one token (zeros past cols), in two 16-byte loads when
// aligned (vec) and whole.
__device__ __forceinline__ void load_x8(const float* xt, int64_t base, int64_t cols, bool vec, float* xv) {
  if (vec && base + 8 <= cols) {
    const float4 a = reinterpret_cast<const float4*>(xt)[0], b = reinterpret_cast<const float4*>(xt)[1];
    xv[0] = a.x;
    xv[1] = a.y;
    xv[2] = a.z;
    xv[3] = a.w;
    xv[4] = b.x;
    xv[5] = b.y;
    xv[6] = b.z;
    xv[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) xv[j] = base + j < cols ? xt[j] : 0.f;
  }
}

// f16/bf16 rows read fully coalesced: lane l takes 8-element vectors l, l + 32, ... (a warp
// reads 512 contiguous bytes per load), U vectors in flight. A token's arithmetic is fixed
// by the row alone (vector order, then the warp sum): batch-invariant like the others.
template <bool BF16, int NT, int U>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_half_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                     const float* __restrict__ x, int64_t ldx, int64_t n, bool vec, float* __restrict__ y,
                     int64_t ldy) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n - t0 < NT ? static_cast<int>(n - t0) : NT;
  x += t0 * ldx;
  y += t0 * ldy;
  const uint4* row = reinterpret_cast<const uint4*>(w + static_cast<size_t>(r) * row_bytes);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  const int64_t num_vecs = (cols + 7) / 8;  // rows are padded to 32 columns with zeros
  for (int64_t v0 = lane; v0 < num_vecs; v0 += 32 * U) {
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v0 + 32 * u < num_vecs) raw[u] = __ldcs(row + v0 + 32 * u);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + 32 * u;
      if (v >= num_vecs) break;
      float wv[8];
      unpack8<BF16>(raw[u], wv);
      const int64_t base = v * 8;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        float xv[8];
        load_x8(x + t * ldx + base, base, cols, vec, xv);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s = fmaf(wv[j], xv[j], s);
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= nt) break;
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * ldy + r] = s;
  }
}

// f16/bf16 for 2..8 tokens: each warp takes R rows, so every x vector it loads serves R
// rows (gemv_half_kernel loads the NT tokens' x once per row: NT times the weight bytes
// through L1). The arithmetic of each (row, token) is gemv_half_kernel's exactly -- lane l
// sums the vectors l, l + 32, ... in order, each an fmaf chain over its 8 elements from 0,
// then the same warp sum -- so the bits equal the one-token kernel's and stay
// batch-invariant. The rows are R / E::kRows items of the epilogue E (gemv_epilogue.cuh:
// plain rows, or a fused SiLU or RoPE + KV write); items past the end re-read the warp's
// first item and are not stored.
// For 2+ tokens the block stages each tile of 32 U vectors of its tokens' x in shared
// memory, each vector's two halves in separate arrays: read straight from global memory,
// lane l's two 16-byte loads 32 bytes apart touched twice the sectors they used (a warp's
// load, 8 cache lines), and each of the block's warps read all of x again (from L2 where x
// outgrew L1: 8 tokens of 14336 columns are 458 KB). Staged, a lane's read of a half is
// one of 32 contiguous 16-byte reads, and the block reads x from global memory once, with
// contiguous 16-byte loads. The values are the same, so are the bits. (One token keeps the
// direct loads: there x is no more bytes than the weights a lane reads.)
template <bool BF16, int NT, int R, class E = RowsOut>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_half_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t cols, const float* __restrict__ x,
                          int64_t ldx, int64_t n, bool vec, E out) {
  constexpr int U = 2;  // vectors per row in flight
  constexpr int K = E::kRows, P = R / K;
  static_assert(R % K == 0, "whole items per warp");
  constexpr bool kStage = NT > 1;
  constexpr int V = 32 * U;  // vectors of a staged tile
  // [token][half][vector]; a half's array padded by four vectors, so that the 8 threads of a
  // quarter-warp storing 4 vectors' two halves hit distinct banks
  __shared__ float4 xs[kStage ? NT : 1][2][V + 4];
  const int lane = threadIdx.x & 31;
  const int64_t item0 = (int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5)) * P;
  const int64_t items = out.items();
  const bool active = item0 < items;  // (warps past the end still stage their share of x)
  if (!kStage && !active) return;
  const int np = !active ? 0 : items - item0 < P ? static_cast<int>(items - item0) : P;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n - t0 < NT ? static_cast<int>(n - t0) : NT;
  x += t0 * ldx;
  const uint4* wr[R];
#pragma unroll
  for (int i = 0; i < R; ++i)
    wr[i] = reinterpret_cast<const uint4*>(
        w + static_cast<size_t>(out.row(active ? item0 + (i / K < np ? i / K : 0) : 0, i % K)) * row_bytes);
  float acc[R][NT];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[i][t] = 0.f;
  const int64_t num_vecs = (cols + 7) / 8;  // rows are padded to 32 columns with zeros
  for (int64_t tile = 0; tile < num_vecs; tile += V) {
    const int64_t v0 = tile + lane;
    uint4 raw[U][R];
    if (active)
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (v0 + 32 * u < num_vecs)
#pragma unroll
          for (int i = 0; i < R; ++i) raw[u][i] = __ldcs(wr[i] + v0 + 32 * u);
    if constexpr (kStage) {
      __syncthreads();  // (every warp has read the last tile)
      for (int e = threadIdx.x; e < nt * 2 * V; e += kWarpsPerBlock * 32) {
        const int t = e / (2 * V), k = e % (2 * V);  // k: half k & 1 of vector k >> 1
        const int64_t base = tile * 8 + 4 * k;
        const float* xt = x + t * ldx + base;
        float4 h;
        if (vec && base + 4 <= cols) {
          h = *reinterpret_cast<const float4*>(xt);
        } else {
          h.x = base < cols ? xt[0] : 0.f;
          h.y = base + 1 < cols ? xt[1] : 0.f;
          h.z = base + 2 < cols ? xt[2] : 0.f;
          h.w = base + 3 < cols ? xt[3] : 0.f;
        }
        xs[t][k & 1][k >> 1] = h;
      }
      __syncthreads();
      if (!active) continue;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = v0 + 32 * u;
      if (v >= num_vecs) break;
      float wv[R][8];
#pragma unroll
      for (int i = 0; i < R; ++i) unpack8<BF16>(raw[u][i], wv[i]);
      const int64_t base = v * 8;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
        float xv[8];
        if constexpr (kStage) {
          const float4 a = xs[t][0][lane + 32 * u], b = xs[t][1][lane + 32 * u];
          xv[0] = a.x;
          xv[1] = a.y;
          xv[2] = a.z;
          xv[3] = a.w;
          xv[4] = b.x;
          xv[5] = b.y;
          xv[6] = b.z;
          xv[7] = b.w;
        } else {
          load_x8(x + t * ldx + base, base, cols, vec, xv);
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
          float s = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) s = fmaf(wv[i][j], xv[j], s);
          acc[i][t] += s;
        }
      }
    }
  }
  if (!active) return;
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
constexpr int kHalfRowsPerWarp = 4;         // (also gemv_rows_kernel's R)
constexpr int64_t kHalfMultiRowMin = 4096;  // fewer rows: one per warp, to keep every SM busy

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
// Chooses the kernel for one token-group size, by weight type only (never by batch, so
// results stay batch-invariant): coalesced vectors for f16/bf16 (one row per warp for one
// token or a small matrix, kHalfRowsPerWarp rows per warp otherwise: the same bits), the
// shared-x kernel for the rest. `simple` forces the shared-x kernel for f16/bf16 too (benchmark comparison).
template <DType T, int NT>
void launch_gemv(dim3 grid, dim3 block, cudaStream_t stream, bool simple, const uint8_t* w, size_t row_bytes,
                 int64_t rows, int64_t cols, const float* x, int64_t ldx, int64_t n, bool vec, float* y, int64_t ldy) {
  if constexpr (T == DType::F16 || T == DType::BF16) {
    if (!simple && (NT == 1 || rows < kHalfMultiRowMin)) {
      gemv_half_kernel<T == DType::BF16, NT, 4>
          <<<grid, block, 0, stream>>>(w, row_bytes, rows, cols, x, ldx, n, vec, y, ldy);
      return;
    }
    if (!simple) {
      constexpr int64_t per_block = int64_t{kWarpsPerBlock} * kHalfRowsPerWarp;
      const dim3 g(static_cast<unsigned>((rows + per_block - 1) / per_block), grid.y);
      gemv_half_rows_kernel<T == DType::BF16, NT, kHalfRowsPerWarp>
          <<<g, block, 0, stream>>>(w, row_bytes, cols, x, ldx, n, vec, RowsOut{y, ldy, rows});
      return;
    }
  }
  if constexpr (NT == 1 && T != DType::F16 && T != DType::BF16) {
    if (!simple && rows >= kHalfMultiRowMin) {
      constexpr int64_t per_block = int64_t{kWarpsPerBlock} * kHalfRowsPerWarp;
      gemv_rows_kernel<T, kHalfRowsPerWarp>
          <<<dim3(static_cast<unsigned>((rows + per_block - 1) / per_block)), block, 0, stream>>>(w, row_bytes, rows,
                                                                                                  cols, x, y);
      return;
    }
  }
  gemv_kernel<T, NT><<<grid, block, 0, stream>>>(w, row_bytes, rows, cols, x, ldx, n, y, ldy);
}

#endif

template <DType T>
__global__ void dequant_f16_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                                   __half* __restrict__ out) {
  const int64_t num_chunks = (cols + 31) / 32;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * num_chunks;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / num_chunks, c = i % num_chunks;
    float v[32];
    dequant32<T>(w + static_cast<size_t>(r) * row_bytes, c, num_chunks, v);
    __half* o = out + r * cols + c * 32;
    const int lim = cols - c * 32 < 32 ? static_cast<int>(cols - c * 32) : 32;
    for (int j = 0; j < lim; ++j) o[j] = __float2half_rn(v[j]);
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION
cudaError_t gemv(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const float* x, int64_t ldx,
                 int64_t n, float* y, int64_t ldy, cudaStream_t stream, bool simple) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto* wb = static_cast<const uint8_t*>(w);
  // Every float4 load of x must be aligned: the base and the row stride.
  const bool vec = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (ldx % 4 == 0);
  const dim3 block(kWarpsPerBlock * 32);
  const bool ok = dispatch_dtype(type, [&]<DType T>() {
    with_token_groups(n, [&]<int NT>(unsigned groups) {
      launch_gemv<T, NT>(dim3(blocks, groups), block, stream, simple, wb, row_bytes, rows, cols, x, ldx, n, vec, y,
                         ldy);
    });
  });
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

namespace {
// A fused GEMV's launch: blocks of kWarpsPerBlock warps of R / E::kRows items each, token
// groups as gemv()'s (the bits do not depend on either).
template <bool BF16, int R, class E>
void launch_half_fused(const uint8_t* w, size_t row_bytes, int64_t cols, const float* x, int64_t n, const E& out,
                       cudaStream_t stream) {
  constexpr int64_t per_block = int64_t{kWarpsPerBlock} * (R / E::kRows);
  const unsigned blocks = static_cast<unsigned>((out.items() + per_block - 1) / per_block);
  const bool vec = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (cols % 4 == 0);
  const dim3 block(kWarpsPerBlock * 32);
  with_token_groups(n, [&]<int NT>(unsigned groups) {
    gemv_half_rows_kernel<BF16, NT, R, E>
        <<<dim3(blocks, groups), block, 0, stream>>>(w, row_bytes, cols, x, cols, n, vec, out);
  });
}
}  // namespace

bool has_fused_gemv(DType type) { return type == DType::F16 || type == DType::BF16 || uses_q8_activations(type); }

cudaError_t gemv_silu(DType type, const void* w, size_t row_bytes, int64_t ffn, int64_t cols, const float* x,
                      const uint8_t* xq, int64_t n, float* out, int64_t ldo, cudaStream_t stream, const SiluQ8Args& q) {
  if (n <= 0 || ffn <= 0) return cudaSuccess;
  if (uses_q8_activations(type)) return gemv_q8_silu(type, w, row_bytes, ffn, cols, xq, n, out, ldo, stream, q);
  if (type != DType::F16 && type != DType::BF16) return cudaErrorInvalidValue;
  if (q.xq) return cudaErrorInvalidValue;  // (the int8 GEMV's epilogue only)
  const auto* wb = static_cast<const uint8_t*>(w);
  const SiluOut o{out, ldo, ffn};
  // (two gate/up pairs a warp where the plain GEMV would take four rows a warp)
  const bool bf16 = type == DType::BF16, multi = 2 * ffn >= kHalfMultiRowMin;
  if (bf16 && multi)
    launch_half_fused<true, 4>(wb, row_bytes, cols, x, n, o, stream);
  else if (bf16)
    launch_half_fused<true, 2>(wb, row_bytes, cols, x, n, o, stream);
  else if (multi)
    launch_half_fused<false, 4>(wb, row_bytes, cols, x, n, o, stream);
  else
    launch_half_fused<false, 2>(wb, row_bytes, cols, x, n, o, stream);
  return cudaGetLastError();
}

cudaError_t gemv_rope_kv_write(DType type, const void* w, size_t row_bytes, int64_t cols, const float* x,
                               const uint8_t* xq, int64_t n, const RopeKvArgs& args, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (args.head_dim <= 0 || args.head_dim % 2 != 0) return cudaErrorInvalidValue;
  if (uses_q8_activations(type)) return gemv_q8_rope_kv_write(type, w, row_bytes, cols, xq, n, args, stream);
  if (type != DType::F16 && type != DType::BF16) return cudaErrorInvalidValue;
  const auto* wb = static_cast<const uint8_t*>(w);
  if (type == DType::BF16)
    launch_half_fused<true, 2>(wb, row_bytes, cols, x, n, RopeKvOut{args}, stream);
  else
    launch_half_fused<false, 2>(wb, row_bytes, cols, x, n, RopeKvOut{args}, stream);
  return cudaGetLastError();
}

cudaError_t dequant_to_f16(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, void* out,
                           cudaStream_t stream) {
  const int64_t work = rows * ((cols + 31) / 32);
  if (work <= 0) return cudaSuccess;
  const int64_t b = (work + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(b < 1 << 20 ? b : 1 << 20);
  const bool ok = dispatch_dtype(type, [&]<DType T>() {
    dequant_f16_kernel<T>
        <<<blocks, 256, 0, stream>>>(static_cast<const uint8_t*>(w), row_bytes, rows, cols, static_cast<__half*>(out));
  });
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
