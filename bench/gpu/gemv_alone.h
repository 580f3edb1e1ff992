// The GEMV kernels timed alone, on the bench's own stream (bench/gpu/gemv_alone.cpp): what
// the quantized-GEMV target measures, without the host's launch cost or the quantizing of
// the activations that the backend's matmul() adds when no norm has done it before.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "bench/gpu/gpu_targets.h"
#include "common/dtype.h"

namespace gpu_bench {

// loop_ms(fn, sync): ms per call of fn, kept busy for 100 ms (gpu_bench.cpp).
using LoopMs = std::function<double(const std::function<void()>&, const std::function<void()>&)>;

// One token x (cols values) through the GEMV kernel of `type` (cuda::gemv_q8 for the
// int8-activation types, cuda::gemv for the others) over a [rows, cols] GGUF matrix (gguf:
// its rows), in enough
// device copies (at least 2) to stream stream_bytes, so that the L2 cannot hold them:
// launched one after another, and replayed from a CUDA graph of one launch per copy (as a
// decode step's graph runs them). GB/s counts the weight bytes of the GGUF matrix, as the
// backend rows do. y (if given): the product, as the last launch left it.
std::vector<Row> gemv_alone_rows(troupe::DType type, const std::vector<uint8_t>& gguf, int64_t rows, int64_t cols,
                                 const std::vector<float>& x, double copy_gbs, const LoopMs& loop_ms,
                                 size_t stream_bytes = size_t{512} << 20, std::vector<float>* y = nullptr);

}  // namespace gpu_bench
