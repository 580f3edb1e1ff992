// The CUDA backend's device memory for a model (host code, private to kernels/cuda/):
// weights in the device layout (kernels/cuda/layout.h) and the f16 paged KV cache. Each
// owns its allocations; cuda_backend.cpp makes them through the two functions below.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace troupe::cuda {

class CudaWeight final : public Weight {
 public:
  ~CudaWeight() override {
    if (data) cudaFree(data);
  }
  void* data = nullptr;
  size_t row_bytes = 0;  // stride between rows in the device layout (kernels/cuda/layout.h)
};

class CudaKvCache final : public KvCache {
 public:
  explicit CudaKvCache(const KvCacheShape& s) : shape_(s) {}
  ~CudaKvCache() override {
    if (k) cudaFree(k);
    if (v) cudaFree(v);
  }
  const KvCacheShape& shape() const override { return shape_; }
  KvCacheShape shape_;
  size_t layer_elems = 0;               // num_blocks * block_size * num_kv_heads * head_dim
  uint16_t *k = nullptr, *v = nullptr;  // [num_layers, layer_elems] f16
};

// A weight of `cols` columns from host rows in GGUF layout (parts: pointer, rows), made on
// `device`: converted to the device layout through at most 64 MB of host staging, or
// copied as is where the layouts agree, on `stream` (done when this returns). Errors name
// the unsupported type or the failed call.
Result<std::unique_ptr<CudaWeight>> upload_weight(int device, cudaStream_t stream, DType type, int64_t cols,
                                                  const std::vector<std::pair<const void*, int64_t>>& parts);
// A K and V cache of shape s on `device` (head_dim a multiple of 32, at most 256), zeroed
// in `stream`'s order.
Result<std::unique_ptr<CudaKvCache>> allocate_kv_cache(int device, cudaStream_t stream, const KvCacheShape& s);

}  // namespace troupe::cuda
