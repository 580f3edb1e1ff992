// Small element-wise ops: SiLU-gated multiply, residual add, bias add, row gather, f32->f16/bf16
// (to_half_rows_kernel, in common.cuh).
#include <algorithm>
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

constexpr int kThreads = 256;
[[maybe_unused]] unsigned blocks_for(int64_t count) {  // (unused where the emulation tests include this)
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void silu_mul_kernel(const float* gu, int64_t n, int64_t ffn, float* out, HalfOut xh) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * ffn; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / ffn, j = i % ffn;
    const float g = gu[t * 2 * ffn + j], u = gu[t * 2 * ffn + ffn + j];
    const float v = silu_gate(g, u);
    out[i] = v;
    if (xh.p) store_half(xh, i, v);
  }
}
__global__ void add_kernel(float* x, const float* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x)
    x[i] += y[i];
}
__global__ void add_bias_kernel(float* y, int64_t ld, const float* bias, int64_t n, int64_t dim) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * dim; i += int64_t{gridDim.x} * blockDim.x)
    y[(i / dim) * ld + i % dim] += bias[i % dim];
}
__global__ void gather_kernel(const float* x, int64_t dim, const int32_t* rows, float* out) {
  const float* src = x + static_cast<int64_t>(rows[blockIdx.x]) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) out[blockIdx.x * dim + j] = src[j];
}

// One block per token; meta holds src [n k] then the weights' bits [n k] (one upload).
__global__ void moe_combine_kernel(const float* y, int64_t dim, const int32_t* meta, int64_t n, int32_t k, float* out) {
  const int64_t t = blockIdx.x;
  const int32_t* src = meta + t * k;
  const int32_t* wbits = meta + n * k + t * k;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = __int_as_float(wbits[0]) * y[static_cast<int64_t>(src[0]) * dim + i];
    for (int32_t j = 1; j < k; ++j) acc += __int_as_float(wbits[j]) * y[static_cast<int64_t>(src[j]) * dim + i];
    out[t * dim + i] = acc;
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
cudaError_t silu_mul(const float* gate_up, int64_t n, int64_t ffn, float* out, cudaStream_t stream, HalfOut xh) {
  if (n * ffn <= 0) return cudaSuccess;
  silu_mul_kernel<<<blocks_for(n * ffn), kThreads, 0, stream>>>(gate_up, n, ffn, out, xh);
  return cudaGetLastError();
}
cudaError_t add(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, y, count);
  return cudaGetLastError();
}
cudaError_t add_bias(float* y, int64_t ld, const float* bias, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n * dim <= 0) return cudaSuccess;
  add_bias_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(y, ld, bias, n, dim);
  return cudaGetLastError();
}
cudaError_t moe_combine(const float* y, int64_t dim, const int32_t* meta, int64_t n, int32_t k, float* out,
                        cudaStream_t stream) {
  if (n <= 0 || k <= 0) return cudaSuccess;
  moe_combine_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(y, dim, meta, n, k, out);
  return cudaGetLastError();
}
cudaError_t gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  gather_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, dim, rows, out);
  return cudaGetLastError();
}
template <typename H>
void launch_to_half_rows(const float* x, int64_t ldx, int64_t n, int64_t cols, int64_t ld_out, int64_t n_pad, H* out,
                         cudaStream_t stream) {
  const bool vec = ldx % 4 == 0 && cols % 4 == 0 && ld_out % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t items = n_pad * (vec ? ld_out / 4 : ld_out);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, 8192));
  if (vec)
    to_half_rows_kernel<H, true><<<blocks, kThreads, 0, stream>>>(x, ldx, n, cols, ld_out, n_pad, out);
  else
    to_half_rows_kernel<H, false><<<blocks, kThreads, 0, stream>>>(x, ldx, n, cols, ld_out, n_pad, out);
}
cudaError_t to_half_rows(const float* x, int64_t ldx, int64_t n, int64_t cols, int64_t ld_out, int64_t n_pad, void* out,
                         bool to_bf16, cudaStream_t stream) {
  if (n_pad <= 0 || ld_out <= 0) return cudaSuccess;
  if (n < 0 || n > n_pad || cols < 0 || cols > ld_out || (n > 0 && cols > ldx)) return cudaErrorInvalidValue;
  if (to_bf16)
    launch_to_half_rows(x, ldx, n, cols, ld_out, n_pad, static_cast<__nv_bfloat16*>(out), stream);
  else
    launch_to_half_rows(x, ldx, n, cols, ld_out, n_pad, static_cast<__half*>(out), stream);
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
