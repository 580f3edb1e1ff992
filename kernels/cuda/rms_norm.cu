// Fused RMSNorm: one block per row, the sum of squares reduced in float (GGML sums in
// double on the CPU; the difference is far inside the f32 tolerance).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t dim, float* out) {
  const float* xr = x + blockIdx.x * dim;
  float* o = out + blockIdx.x * dim;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
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
  const float scale = rsqrtf(part[0] / static_cast<float>(dim) + eps);
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = xr[j] * scale * w[j];
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(x, w, eps, dim, out);
  return cudaGetLastError();
}

}  // namespace troupe::cuda
