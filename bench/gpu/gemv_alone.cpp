// The GEMV kernels timed alone (gemv_alone.h).
#include "bench/gpu/gemv_alone.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/layout.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace gpu_bench {
namespace {
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gemv_alone: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
}  // namespace

std::vector<Row> gemv_alone_rows(troupe::DType type, const std::vector<uint8_t>& gguf, int64_t rows, int64_t cols,
                                 const std::vector<float>& xs, double copy_gbs, const LoopMs& loop_ms,
                                 size_t stream_bytes, std::vector<float>* y_out) {
  using namespace troupe;
  size_t rb = 0;
  const std::vector<uint8_t> dev_rows = test::device_rows(type, gguf, rows, cols, &rb);
  const size_t bytes = dev_rows.size();
  const int copies = static_cast<int>(std::max<size_t>(2, stream_bytes / bytes + 1));
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  uint8_t* w = nullptr;
  ck(cudaMalloc(reinterpret_cast<void**>(&w), bytes * copies), "cudaMalloc(weights)");
  // (Copies on st, waited for: a cudaMemcpy from pageable memory is on the legacy stream,
  // which st does not wait for, and may return before its bytes land.)
  for (int i = 0; i < copies; ++i)
    ck(cudaMemcpyAsync(w + bytes * i, dev_rows.data(), bytes, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync(w)");
  if (xs.size() != static_cast<size_t>(cols)) {
    std::fprintf(stderr, "gemv_alone: x has %zu values for %lld columns\n", xs.size(), static_cast<long long>(cols));
    std::exit(1);
  }
  float *x = nullptr, *y = nullptr;
  uint8_t* xq = nullptr;
  ck(cudaMalloc(reinterpret_cast<void**>(&x), xs.size() * 4), "cudaMalloc(x)");
  ck(cudaMalloc(reinterpret_cast<void**>(&y), static_cast<size_t>(rows) * 4), "cudaMalloc(y)");
  ck(cudaMemcpyAsync(x, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync(x)");
  ck(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  const bool q8 = cuda::uses_q8_activations(type);
  if (q8) {  // once: in a decode step the norm before the matmul writes them
    ck(cudaMalloc(reinterpret_cast<void**>(&xq), cuda::q8_row_bytes(cols)), "cudaMalloc(xq)");
    ck(cuda::quantize_q8(type, x, cols, cols, 1, xq, st), "quantize_q8");
  }
  auto launch = [&](int i) {
    const uint8_t* wi = w + bytes * static_cast<size_t>(i);
    return q8 ? cuda::gemv_q8(type, wi, rb, rows, cols, xq, 1, y, rows, st)
              : cuda::gemv(type, wi, rb, rows, cols, x, cols, 1, y, rows, st);
  };
  auto sync = [&] { ck(cudaStreamSynchronize(st), "cudaStreamSynchronize"); };
  int k = 0;
  const double eager_ms = loop_ms([&] { ck(launch(k++ % copies), "gemv launch"); }, sync);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < copies; ++i) ck(launch(i), "gemv launch (capture)");
  ck(cudaStreamEndCapture(st, &graph), "cudaStreamEndCapture");
  ck(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  const double graph_ms = loop_ms([&] { ck(cudaGraphLaunch(exec, st), "cudaGraphLaunch"); }, sync) / copies;
  if (y_out) {
    y_out->assign(static_cast<size_t>(rows), 0.0f);
    ck(cudaMemcpyAsync(y_out->data(), y, y_out->size() * 4, cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync(y)");
    sync();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  if (xq) cudaFree(xq);
  cudaStreamDestroy(st);
  const std::string name = std::string("GEMV ") + std::string(dtype_traits(type).name) +
                           (q8 ? " kernel alone (int8 x quantized once)" : " kernel alone (f32 x)");
  const std::string shape = std::to_string(rows) + "x" + std::to_string(cols) + ", n=1";
  auto row = [&](const std::string& how, double ms) {
    const double gbs = static_cast<double>(gguf.size()) / (ms * 1e-3) / 1e9;
    return Row{name + how, shape, ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"};
  };
  return {row(", launches in a row", eager_ms), row(", in a CUDA graph of " + std::to_string(copies), graph_ms)};
}

}  // namespace gpu_bench
