// RoPE in place on the Q or K columns of the fused QKV output, angles from the step's table.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t ld, int64_t num_heads, int64_t head_dim, const float* cos_sin, bool neox) {
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2;
  const float* cs = cos_sin + t * head_dim;
  for (int64_t k = threadIdx.x; k < num_heads * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    float* v = x + t * ld + h * head_dim;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

}  // namespace

cudaError_t rope(float* x, int64_t ld, int64_t n, int64_t num_heads, int64_t head_dim, const float* cos_sin,
                 bool neox, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(x, ld, num_heads, head_dim, cos_sin, neox);
  return cudaGetLastError();
}

}  // namespace troupe::cuda
