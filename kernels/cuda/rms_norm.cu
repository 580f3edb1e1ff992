// Fused RMSNorm: one block per row, the sum of squares reduced in float (GGML sums in
// double on the CPU; the difference is far inside the f32 tolerance). add_rms_norm adds the
// residual first, in the same pass: each thread adds, stores and squares the elements it
// later normalizes, so the bits equal add() followed by rms_norm(). Given xq, both also
// quantize their output for the int8 GEMV that reads it next (quantize_q8.cuh): with 256
// threads striding a row, a warp's 32 consecutive values are one 32-value block, so the
// warp quantizes what it has just computed, as quantize_q8() would from memory (the same
// bytes) -- one launch instead of two. Given xh, they write it in half for the cuBLAS
// matmul instead (to_half_rows()'s bits).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quantize_q8.cuh"

namespace troupe::cuda {
namespace {

constexpr int kThreads = 256;

// The block's sum of the threads' partial sums (every thread gets it).
__device__ __forceinline__ float block_sum(float ss) {
  __shared__ float part[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) part[0] = v;
  }
  __syncthreads();
  return part[0];
}

// The normalized row's element j (thread j % 256 of the block), stored, and quantized into
// the row's xq blocks when asked (dim % 32 == 0, so the branch is uniform in a warp), or
// stored in half.
__device__ __forceinline__ void emit(float v, int64_t j, float* o, uint8_t* xq, int64_t dim, Q8Numerics nq,
                                     HalfOut xh) {
  o[j] = v;
  if (xq) quantize_q8_block(v, threadIdx.x & 31, j / 32, dim / 32, xq + blockIdx.x * q8_row_bytes(dim), nq);
  if (xh.p) store_half(xh, blockIdx.x * dim + j, v);
}

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t dim, float* out, uint8_t* xq,
                                Q8Numerics nq, HalfOut xh) {
  const float* xr = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  const float scale = rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) emit(xr[j] * scale * w[j], j, o, xq, dim, nq, xh);
}

// out may alias y: every y element is read before the block's barrier, out written after.
__global__ void add_rms_norm_kernel(float* x, const float* y, const float* w, float eps, int64_t dim, float* out,
                                    uint8_t* xq, Q8Numerics nq, HalfOut xh) {
  float* xr = x + blockIdx.x * dim;
  const float* yr = y + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float v = xr[j] + yr[j];
    xr[j] = v;
    ss += v * v;
  }
  const float scale = rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) emit(xr[j] * scale * w[j], j, o, xq, dim, nq, xh);
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
cudaError_t rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out, cudaStream_t stream,
                     uint8_t* xq, Q8Numerics nq, HalfOut xh) {
  if (n <= 0) return cudaSuccess;
  if (xq && dim % 32 != 0) return cudaErrorInvalidValue;
  rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, eps, dim, out, xq, nq, xh);
  return cudaGetLastError();
}

cudaError_t add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                         cudaStream_t stream, uint8_t* xq, Q8Numerics nq, HalfOut xh) {
  if (n <= 0) return cudaSuccess;
  if (xq && dim % 32 != 0) return cudaErrorInvalidValue;
  add_rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, y, w, eps, dim, out, xq, nq, xh);
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
