// Weights and the KV cache on the device (device_memory.h).
#include "kernels/cuda/device_memory.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {
// Host memory a weight's rows are converted to the device layout through, at most.
constexpr size_t kStagingBytes = size_t{64} << 20;
}  // namespace

Result<std::unique_ptr<CudaWeight>> upload_weight(int device, cudaStream_t stream, DType type, int64_t cols,
                                                  const std::vector<std::pair<const void*, int64_t>>& parts) {
  if (!is_supported_type(type))
    return make_error(std::string("weight type ") + std::string(dtype_traits(type).name) + " has no CUDA kernels");
  const auto src_row = row_bytes(type, static_cast<uint64_t>(cols));
  const auto dev_row = device_row_bytes(type, cols);
  if (!src_row || !dev_row || cols <= 0)
    return make_error("weight columns " + std::to_string(cols) + " do not fit the block size");
  // Rows in the device layout (kernels/cuda/layout.h): float rows padded to 32 columns,
  // the 32-value block types and Q6_K split into quants, high bits and scales.
  const size_t stride = *dev_row;
  const bool as_is = stride == *src_row && !split_layout(type);
  int64_t rows = 0;
  for (const auto& [p, r] : parts) {
    if (!p || r <= 0) return make_error("empty weight part");
    rows += r;
  }
  auto w = std::make_unique<CudaWeight>();
  w->type = type;
  w->rows = rows;
  w->cols = cols;
  w->row_bytes = stride;
  cudaSetDevice(device);
  if (cudaError_t e = cudaMalloc(&w->data, stride * static_cast<size_t>(rows)); e != cudaSuccess) {
    w->data = nullptr;
    return make_error("cudaMalloc of " + std::to_string(stride * rows) +
                      " bytes for a weight: " + cudaGetErrorString(e));
  }
  // Copies on the backend's stream, each waited for: the synchronous cudaMemcpy goes through
  // the legacy stream, which the backend's non-blocking stream does not wait for, and from
  // pageable memory it may return before the copy has landed.
  auto copy = [stream](void* dst, const void* src, size_t bytes) {
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
    return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
  };
  size_t off = 0;
  std::vector<uint8_t> staging;
  for (const auto& [p, r] : parts) {
    cudaError_t e;
    if (as_is) {
      e = copy(static_cast<uint8_t*>(w->data) + off, p, *src_row * static_cast<size_t>(r));
    } else {  // converted in chunks of rows, so the host holds at most kStagingBytes more
      const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes / stride));
      e = cudaSuccess;
      for (int64_t r0 = 0; r0 < r && e == cudaSuccess; r0 += chunk) {
        const int64_t nr = std::min(chunk, r - r0);
        staging.resize(stride * static_cast<size_t>(nr));
        for (int64_t i = 0; i < nr; ++i)
          to_device_row(type, static_cast<const uint8_t*>(p) + *src_row * (r0 + i), cols, staging.data() + stride * i);
        e = copy(static_cast<uint8_t*>(w->data) + off + stride * r0, staging.data(), staging.size());
      }
    }
    if (e != cudaSuccess) return make_error(std::string("cudaMemcpy of a weight: ") + cudaGetErrorString(e));
    off += stride * static_cast<size_t>(r);
  }
  return w;
}

Result<std::unique_ptr<CudaKvCache>> allocate_kv_cache(int device, cudaStream_t stream, const KvCacheShape& s) {
  if (s.num_layers <= 0 || s.num_blocks <= 0 || s.block_size <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0)
    return make_error("invalid KV cache shape");
  if (s.head_dim % 32 != 0 || s.head_dim > 256)
    return make_error("the CUDA attention kernel needs a head_dim that is a multiple of 32, at most 256 (got " +
                      std::to_string(s.head_dim) + ")");
  auto c = std::make_unique<CudaKvCache>(s);
  c->layer_elems = static_cast<size_t>(s.num_blocks) * s.block_size * s.num_kv_heads * s.head_dim;
  const size_t bytes = c->layer_elems * s.num_layers * sizeof(uint16_t);
  cudaSetDevice(device);
  for (uint16_t** p : {&c->k, &c->v}) {
    if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(p), bytes); e != cudaSuccess) {
      *p = nullptr;
      return make_error("cudaMalloc of " + std::to_string(bytes) + " bytes for the KV cache: " + cudaGetErrorString(e));
    }
    // (zeroed in the backend stream's order, before any kernel of it reads the cache)
    if (cudaError_t e = cudaMemsetAsync(*p, 0, bytes, stream); e != cudaSuccess)
      return make_error(std::string("cudaMemset of the KV cache: ") + cudaGetErrorString(e));
  }
  return c;
}

}  // namespace troupe::cuda

namespace troupe {
std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  if (count == 0) return "no CUDA device is present";
  return {};
}
}  // namespace troupe
