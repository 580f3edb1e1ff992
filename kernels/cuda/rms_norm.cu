// Fused RMSNorm: one block per row, the sum of squares reduced in float (GGML sums in
// double on the CPU; the difference is far inside the f32 tolerance). add_rms_norm adds the
// residual first, in the same pass: each thread adds, stores and squares the elements it
// later normalizes, so the bits equal add() followed by rms_norm().
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

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

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t dim, float* out) {
  const float* xr = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
  const float scale = rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * scale * w[j];
}

// out may alias y: every y element is read before the block's barrier, out written after.
__global__ void add_rms_norm_kernel(float* x, const float* y, const float* w, float eps, int64_t dim, float* out) {
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
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * scale * w[j];
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
cudaError_t rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, w, eps, dim, out);
  return cudaGetLastError();
}

cudaError_t add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_rms_norm_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, y, w, eps, dim, out);
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
