// Fused dequantize-GEMV for decode (weights stay in their GGUF blocks on the device) and
// the dequantize-to-f16 pass that feeds cuBLAS for prefill (cuda_backend.cpp picks).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per output row; lane l decodes chunks l, l + 32, ... of the row and dots them
// with up to NT token rows of x at once (blockIdx.y picks the group of NT tokens), so each
// weight byte is read once per group. A token's arithmetic (chunk order, then the warp
// sum) does not depend on NT, nt or its group: results are batch-invariant, bit for bit.
template <DType T, int NT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                const float* __restrict__ x, int64_t ldx, int64_t n, bool vec, float* __restrict__ y, int64_t ldy) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n - t0 < NT ? static_cast<int>(n - t0) : NT;
  x += t0 * ldx;
  y += t0 * ldy;
  const uint8_t* row = w + static_cast<size_t>(r) * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  const int64_t num_chunks = (cols + 31) / 32;
  float wv[32], xv[32];
  for (int64_t c = lane; c < num_chunks; c += 32) {
    dequant32<T>(row, c, wv);
    const int64_t base = c * 32;
    const bool full = base + 32 <= cols;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      const float* xt = x + t * ldx + base;
      if (vec && full) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 v = reinterpret_cast<const float4*>(xt)[i];
          xv[4 * i] = v.x; xv[4 * i + 1] = v.y; xv[4 * i + 2] = v.z; xv[4 * i + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) xv[j] = base + j < cols ? xt[j] : 0.f;
      }
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j) s = fmaf(wv[j], xv[j], s);
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= nt) break;
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * ldy + r] = s;
  }
}

template <DType T>
__global__ void dequant_f16_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
                                   __half* __restrict__ out) {
  const int64_t num_chunks = (cols + 31) / 32;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * num_chunks;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / num_chunks, c = i % num_chunks;
    float v[32];
    dequant32<T>(w + static_cast<size_t>(r) * row_bytes, c, v);
    __half* o = out + r * cols + c * 32;
    const int lim = cols - c * 32 < 32 ? static_cast<int>(cols - c * 32) : 32;
    for (int j = 0; j < lim; ++j) o[j] = __float2half_rn(v[j]);
  }
}

}  // namespace

cudaError_t gemv(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const float* x, int64_t ldx,
                 int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto* wb = static_cast<const uint8_t*>(w);
  // Every float4 load of x must be aligned: the base and the row stride.
  const bool vec = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (ldx % 4 == 0);
  const dim3 block(kWarpsPerBlock * 32);
  const bool ok = dispatch_dtype(type, [&]<DType T>() {
    if (n == 1) {
      gemv_kernel<T, 1><<<dim3(blocks, 1), block, 0, stream>>>(wb, row_bytes, rows, cols, x, ldx, n, vec, y, ldy);
    } else if (n == 2) {
      gemv_kernel<T, 2><<<dim3(blocks, 1), block, 0, stream>>>(wb, row_bytes, rows, cols, x, ldx, n, vec, y, ldy);
    } else if (n <= 4) {
      gemv_kernel<T, 4><<<dim3(blocks, 1), block, 0, stream>>>(wb, row_bytes, rows, cols, x, ldx, n, vec, y, ldy);
    } else {
      const unsigned groups = static_cast<unsigned>((n + 7) / 8);
      gemv_kernel<T, 8><<<dim3(blocks, groups), block, 0, stream>>>(wb, row_bytes, rows, cols, x, ldx, n, vec, y, ldy);
    }
  });
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t dequant_to_f16(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, void* out,
                           cudaStream_t stream) {
  const int64_t work = rows * ((cols + 31) / 32);
  if (work <= 0) return cudaSuccess;
  const int64_t b = (work + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(b < 1 << 20 ? b : 1 << 20);
  const bool ok = dispatch_dtype(type, [&]<DType T>() {
    dequant_f16_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const uint8_t*>(w), row_bytes, rows, cols,
                                                      static_cast<__half*>(out));
  });
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace troupe::cuda
