// GPU microbenchmarks and end-to-end figures for bench/gpu/check.sh (docs/gpu.md).
//   troupe_gpu_bench OUT_DIR [--config configs/llama-3-8b.json]
// Measures, in one run: the ceilings (device-to-device copy bandwidth, cuBLAS bf16 GEMM at
// 8192^3; each kept busy for 100 ms as the kernels are, with a short burst shown beside),
// each CUDA op through the backend interface (time, GB/s or TFLOP/s, % of the ceiling), and Llama-3-8B-shaped dummy bf16 decode at batch 1/8/64/256 with 1024-token
// contexts and a 2048-token prefill, in the batch-invariant (default), cuBLAS and batch-invariant
// tensor-core (--cuda-tc-gemm) modes.
// Writes OUT_DIR/gpu-check.md and OUT_DIR/gpu-check.json.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_util.h"
#include "bench/gpu/gemv_alone.h"
#include "bench/gpu/gpu_targets.h"
#include "kernels/backend.h"
#include "runtime/model/model_files.h"
#include "runtime/model/model.h"
#include "runtime/format/weights.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;
using json = nlohmann::json;

namespace gpu_bench {

Sizes S;
Sizes Sizes::smoke() {
  Sizes z;
  z.copy_bytes = size_t{1} << 20;
  z.gemm = 64;
  z.rows = 96;
  z.cols = 512;  // (whole K-quant super-blocks)
  z.tokens = 24;
  z.stream_bytes = 0;
  z.vocab = 1000;
  z.sample_batch = 3;
  z.attn_ctx = 160;
  z.attn_seqs = 3;
  z.attn_heads = 8;
  z.attn_kv_heads = 2;
  z.q8_tokens = {16, 17};
  z.e2e_ctx = 64;
  z.e2e_prefill = 80;  // (64+ tokens: --cuda-cublas's tensor-core prefill attention)
  z.e2e_batches = {1, 9};
  return z;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<Row> rows;
json out;
std::vector<std::string> failures;  // correctness checks the bench makes on the way (it goes on, then exits 1)
std::string g_dir;                  // OUT_DIR (empty until main sets it)
cudaDeviceProp g_prop{};
void write_outputs(bool last = false);  // OUT_DIR/gpu-check.{md,json}: rewritten after every row

void add(Row r) {
  std::printf("%-44s %-34s %9.3f ms %10.1f %-7s", r.what.c_str(), r.shape.c_str(), r.ms, r.rate, r.unit.c_str());
  if (r.pct >= 0) std::printf(" %6.1f%% of %s", r.pct, r.of.c_str());
  std::printf("\n");
  std::fflush(stdout);
  rows.push_back(std::move(r));
  write_outputs();  // (a later fault or the time limit keeps every row so far)
}
void fail(std::string what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  failures.push_back(std::move(what));
  write_outputs();
}

double loop_ms(const std::function<void()>& fn, const std::function<void()>& sync) {
  fn();
  sync();
  int reps = 1;
  for (;;) {
    const double t0 = now();
    for (int i = 0; i < reps; ++i) fn();
    sync();
    const double dt = now() - t0;
    if (dt >= 0.1 || reps >= 1 << 14) return dt * 1e3 / reps;
    reps *= dt < 0.01 ? 10 : 2;
  }
}
double time_ms(Backend& be, const std::function<void()>& fn) {
  return loop_ms(fn, [&] {
    if (auto st = be.sync(); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().message.c_str());
      std::exit(1);
    }
  });
}
std::vector<uint16_t> random_bf16(size_t n, float scale) {
  std::vector<uint16_t> v(n);
  const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (unsigned t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      uint64_t s = 0x9E3779B97F4A7C15ull * (t + 1);
      for (size_t i = n * t / nt; i < n * (t + 1) / nt; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const float f = scale * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        v[i] = static_cast<uint16_t>(bits >> 16);
      }
    });
  for (auto& x : th) x.join();
  return v;
}

}  // namespace gpu_bench

using namespace gpu_bench;

namespace {

#define CK(call)                                                                                          \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

// Work on the default stream (the ceilings).
double device_loop_ms(const std::function<void()>& fn) {
  return loop_ms(fn, [] { CK(cudaDeviceSynchronize()); });
}

// Mean ms of one call of fn (work on the default stream) over reps calls, by CUDA events.
double event_ms(int reps, const std::function<void(int)>& fn) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) fn(i);
  cudaEventRecord(e1);
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / reps;
}

// ---- ceilings ----------------------------------------------------------------------------
double copy_bandwidth() {
  const size_t bytes = S.copy_bytes;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  int i = 0;
  auto copy = [&] {
    CK(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice));
    ++i;
  };
  const double burst = event_ms(10, [&](int) { copy(); });
  const double per = device_loop_ms(copy);
  cudaFree(a);
  cudaFree(b);
  auto rate = [&](double ms) { return 2.0 * bytes / (ms * 1e-3) / 1e9; };  // bytes read + written
  const double gbs = rate(per);
  add({"ceiling: device-to-device copy", "4 GiB", per, gbs, "GB/s", -1, ""});
  add({"(not a ceiling) the same copy, a burst of 10", "4 GiB", burst, rate(burst), "GB/s", -1, ""});
  return gbs;
}

// cuBLAS bf16 GEMM, C[m, n] = A[m, k] B[k, n] with f32 accumulation: ms per call kept busy
// as the kernels are (loop_ms; the ceiling), and in a burst of 10 after 3 warm-up calls
// (CUDA events; shown beside it, not used).
struct GemmTime {
  double ms, burst_ms;
  double tflops(int64_t m, int64_t n, int64_t k, double t) const { return 2.0 * m * n * k / (t * 1e-3) / 1e12; }
};
GemmTime cublas_time(cublasHandle_t h, int m, int n, int k, cudaDataType_t ctype) {
  auto ha = random_bf16(size_t(m) * k, 1.0f), hb = random_bf16(size_t(k) * n, 1.0f);
  void *a, *b, *c;
  CK(cudaMalloc(&a, ha.size() * 2));
  CK(cudaMalloc(&b, hb.size() * 2));
  CK(cudaMalloc(&c, size_t(m) * n * (ctype == CUDA_R_32F ? 4 : 2)));
  CK(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  const float one = 1, zero = 0;
  auto run = [&] {
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_16BF, k, b, CUDA_R_16BF, k,
                                    &zero, c, ctype, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx: %s\n", cublasGetStatusString(s));
      std::exit(1);
    }
  };
  for (int i = 0; i < 3; ++i) run();
  GemmTime t{};
  t.burst_ms = event_ms(10, [&](int) { run(); });
  t.ms = device_loop_ms(run);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return t;
}

// ---- ops ----------------------------------------------------------------------------------
void bench_gemv(double copy_gbs, bool simple) {
  if (simple) setenv("TROUPE_CUDA_GEMV", "simple", 1);
  auto be = make_cuda_backend({});
  unsetenv("TROUPE_CUDA_GEMV");
  need(be);
  std::mt19937 rng(1);
  const int64_t rows = S.rows, cols = S.cols;
  for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K}) {
    std::vector<uint8_t> data = t == DType::BF16 ? [&] {
      auto v = random_bf16(size_t(rows) * cols, 0.02f);
      std::vector<uint8_t> b(v.size() * 2);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    }() : test::random_weight(t, rows, cols, rng);
    // Enough copies to stream at least 512 MB, so the 60 MB L2 cannot hold them.
    const size_t copies = std::max<size_t>(1, S.stream_bytes / data.size() + 1);
    std::vector<std::unique_ptr<Weight>> ws;
    for (size_t i = 0; i < copies; ++i) {
      auto w = (*be)->make_weight(t, cols, {{data.data(), rows}});
      need(w);
      ws.push_back(std::move(*w));
    }
    float* x = (*be)->upload(test::random_floats(size_t(cols) * 8, rng));
    float* y = (*be)->alloc(size_t(rows) * 8);
    for (int64_t n : {1, 8}) {
      size_t k = 0;
      const double ms = time_ms(**be, [&] { (*be)->matmul(*ws[k++ % copies], x, n, y, rows); });
      const double gbs = data.size() / (ms * 1e-3) / 1e9;
      const bool q8 = t != DType::BF16;  // every quantized type: int8 activations
      const std::string kernel = simple             ? " (f32 x in shared memory)"
                                 : t == DType::BF16 ? " (coalesced, f32 x)"
                                 : q8               ? " (int8 x, dp4a)"
                                                    : " (f32 x in shared memory)";
      add({std::string("GEMV ") + std::string(dtype_traits(t).name) + kernel,
           std::to_string(rows) + "x" + std::to_string(cols) + ", n=" + std::to_string(n), ms, gbs, "GB/s",
           100.0 * gbs / copy_gbs, "copy"});
    }
    // The kernel alone at one token: no host launch cost, no quantizing of x (matmul()
    // above quantizes it in a launch of its own when no norm did it before).
    if (!simple)
      for (Row& r : gpu_bench::gemv_alone_rows(t, data, rows, cols, test::random_floats(size_t(cols), rng), copy_gbs,
                                               loop_ms, S.stream_bytes))
        add(std::move(r));
  }
}

// The gate/up GEMV of Llama-3-8B (2 x 14336 rows) with its SiLU-gated multiply, fused into
// the GEMV's epilogue (the default) and as two launches (TROUPE_CUDA_FUSE=0), one token.
void bench_gemv_silu(double copy_gbs) {
  std::mt19937 rng(5);
  const int64_t ffn = S.rows, cols = S.cols;
  for (DType t : {DType::BF16, DType::Q4_1}) {
    std::vector<uint8_t> data = t == DType::BF16 ? [&] {
      auto v = random_bf16(size_t(2 * ffn) * cols, 0.02f);
      std::vector<uint8_t> b(v.size() * 2);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    }() : test::random_weight(t, 2 * ffn, cols, rng);
    for (bool fused : {true, false}) {
      if (!fused) setenv("TROUPE_CUDA_FUSE", "0", 1);
      auto be = make_cuda_backend({});
      unsetenv("TROUPE_CUDA_FUSE");
      need(be);
      const size_t copies = std::max<size_t>(1, S.stream_bytes / data.size() + 1);
      std::vector<std::unique_ptr<Weight>> ws;
      for (size_t i = 0; i < copies; ++i) {
        auto w = (*be)->make_weight(t, cols, {{data.data(), 2 * ffn}});
        need(w);
        ws.push_back(std::move(*w));
      }
      float* x = (*be)->upload(test::random_floats(size_t(cols), rng));
      float* gu = (*be)->alloc(size_t(2 * ffn));
      float* act = (*be)->alloc(size_t(ffn));
      size_t k = 0;
      const double ms = time_ms(**be, [&] { (*be)->matmul_silu(*ws[k++ % copies], x, 1, ffn, gu, act); });
      const double gbs = data.size() / (ms * 1e-3) / 1e9;
      add({std::string("gate/up GEMV + silu_mul ") + std::string(dtype_traits(t).name) +
               (fused ? " (fused epilogue)" : " (two launches)"),
           "2x14336x4096, n=1", ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
    }
  }
}

// norm_copy_ms: what writing x's bf16 copy adds to the norm before the matmul, at its
// shape (bench_small_ops measures it).
void bench_prefill_matmul(double norm_copy_ms) {
  // (TROUPE_CUDA_FUSE=0: every call converts x to bf16 itself; by default each call after
  // the first takes x in bf16 from the one before, as from the norm or SiLU in the model.)
  setenv("TROUPE_CUDA_FUSE", "0", 1);
  auto be = make_cuda_backend(CudaBackendOptions{0, false});
  unsetenv("TROUPE_CUDA_FUSE");
  auto bf = make_cuda_backend(CudaBackendOptions{0, false});
  need(be);
  need(bf);
  const int64_t rows = S.rows, cols = S.cols, n = S.tokens;
  auto v = random_bf16(size_t(rows) * cols, 0.02f);
  auto w = (*be)->make_weight(DType::BF16, cols, {{v.data(), rows}});
  auto wf = (*bf)->make_weight(DType::BF16, cols, {{v.data(), rows}});
  need(w);
  need(wf);
  std::mt19937 rng(2);
  const auto xs = test::random_floats(size_t(cols) * n, rng);
  float* x = (*be)->upload(xs);
  float* y = (*be)->alloc(size_t(rows) * n);
  const double ms = time_ms(**be, [&] { (*be)->matmul(**w, x, n, y, rows); });
  float* xf = (*bf)->upload(xs);
  float* yf = (*bf)->alloc(size_t(rows) * n);
  const double msf = time_ms(**bf, [&] { (*bf)->matmul(**wf, xf, n, yf, rows); });
  if (std::string st = (*bf)->stats(); st.find("cuBLAS inputs in half from the op before: 0 ") != std::string::npos) {
    fail("prefill matmul: no call took its input in bf16 (" + st + ")");
  }
  cublasHandle_t h;
  cublasCreate(&h);
  const GemmTime gt = cublas_time(h, int(rows), int(n), int(cols), CUDA_R_32F);
  cublasDestroy(h);
  const double ref = gt.tflops(rows, n, cols, gt.ms);
  const double tf = 2.0 * rows * cols * n / (ms * 1e-3) / 1e12;
  add({"cuBLAS bf16 GEMM alone (f32 out)", "14336x4096 x 2048 tokens", gt.ms, ref, "TFLOP/s", -1, ""});
  add({"(not a ceiling) the same GEMM, a burst of 10", "14336x4096 x 2048 tokens", gt.burst_ms,
       gt.tflops(rows, n, cols, gt.burst_ms), "TFLOP/s", -1, ""});
  add({"prefill matmul bf16 (x->bf16 + cuBLAS)", "14336x4096 x 2048 tokens", ms, tf, "TFLOP/s", 100.0 * tf / ref,
       "cuBLAS same shape"});
  // Each call after the first takes the half x the call before left: the GEMM alone, as in
  // the model where the norm, attention or SiLU wrote x in bf16. For the target, the matmul
  // also pays what that copy costs its producer: the norm's time with it less without, at
  // this x's shape (2048 x 4096).
  const double msc = msf + norm_copy_ms;
  const double tff = 2.0 * rows * cols * n / (msf * 1e-3) / 1e12, tfc = 2.0 * rows * cols * n / (msc * 1e-3) / 1e12;
  add({"(GEMM alone) prefill matmul bf16, x given in bf16", "14336x4096 x 2048 tokens", msf, tff, "TFLOP/s",
       100.0 * tff / ref, "cuBLAS same shape, x given"});
  add({"prefill matmul bf16 (x in bf16 from the norm + cuBLAS; the norm's extra store counted)",
       "14336x4096 x 2048 tokens", msc, tfc, "TFLOP/s", 100.0 * tfc / ref, "cuBLAS same shape"});
  auto inv = make_cuda_backend(CudaBackendOptions{0, true});
  auto wi = (*inv)->make_weight(DType::BF16, cols, {{v.data(), rows}});
  float* xi = (*inv)->upload(test::random_floats(size_t(cols) * n, rng));
  float* yi = (*inv)->alloc(size_t(rows) * n);
  const double msi = time_ms(**inv, [&] { (*inv)->matmul(**wi, xi, n, yi, rows); });
  const double tfi = 2.0 * rows * cols * n / (msi * 1e-3) / 1e12;
  add({"prefill matmul bf16 (batch-invariant GEMV)", "14336x4096 x 2048 tokens", msi, tfi, "TFLOP/s", 100.0 * tfi / ref,
       "cuBLAS same shape"});
  CudaBackendOptions to;
  to.tc_gemm = true;
  auto tcb = make_cuda_backend(to);
  auto wt = (*tcb)->make_weight(DType::BF16, cols, {{v.data(), rows}});
  float* xt = (*tcb)->upload(test::random_floats(size_t(cols) * n, rng));
  float* yt = (*tcb)->alloc(size_t(rows) * n);
  const double mst = time_ms(**tcb, [&] { (*tcb)->matmul(**wt, xt, n, yt, rows); });
  const double tft = 2.0 * rows * cols * n / (mst * 1e-3) / 1e12;
  add({"prefill matmul bf16 (batch-invariant tensor cores)", "14336x4096 x 2048 tokens", mst, tft, "TFLOP/s",
       100.0 * tft / ref, "cuBLAS same shape"});
  // The quantized types' prefill matmul: the int8 GEMV (8 tokens a weight read) against its
  // tensor-core kernel (TROUPE_CUDA_Q8_MMA, 64 tokens a weight read), which must give the
  // same bits (a mismatch fails the run: the fragment layout would be wrong); and Q4_1 at
  // decode batch sizes, to choose the token count from which the kernel pays.
  std::vector<std::pair<DType, int64_t>> q8_cases = {{DType::Q4_1, n}, {DType::Q8_0, n}, {DType::Q4_K, n}};
  for (int64_t k : S.q8_tokens) q8_cases.push_back({DType::Q4_1, k});
  for (const auto& [t, nq] : q8_cases) {
    auto data = test::random_weight(t, rows, cols, rng);
    const auto xs = test::random_floats(size_t(cols) * nq, rng);
    std::vector<float> out[2];
    for (int mma = 0; mma < 2; ++mma) {
      if (mma) setenv("TROUPE_CUDA_Q8_MMA", "16", 1);
      auto qb = make_cuda_backend(CudaBackendOptions{0, true});
      unsetenv("TROUPE_CUDA_Q8_MMA");
      need(qb);
      auto wq = (*qb)->make_weight(t, cols, {{data.data(), rows}});
      need(wq);
      float* xq = (*qb)->upload(xs);
      float* yq = (*qb)->alloc(size_t(rows) * nq);
      const double msq = time_ms(**qb, [&] { (*qb)->matmul(**wq, xq, nq, yq, rows); });
      const double tfq = 2.0 * rows * cols * nq / (msq * 1e-3) / 1e12;
      add({std::string(nq == n ? "prefill matmul " : "matmul ") + std::string(dtype_traits(t).name) +
               (mma ? " (int8 tensor cores, TROUPE_CUDA_Q8_MMA)" : " (int8 GEMV, dp4a)"),
           "14336x4096 x " + std::to_string(nq) + " tokens", msq, tfq, "TFLOP/s", nq == n ? 100.0 * tfq / ref : -1,
           nq == n ? "cuBLAS bf16 same shape" : ""});
      out[mma].resize(size_t(rows) * nq);
      (*qb)->copy_out(out[mma].data(), yq, out[mma].size());
      if (!(*qb)->sync().ok()) std::exit(1);
      if (mma && (*qb)->stats().find("int8 matmuls on tensor cores: 0;") != std::string::npos)
        fail("int8 tensor-core matmul " + std::string(dtype_traits(t).name) + " at " + std::to_string(nq) +
             " tokens: the kernel did not run (the bit check compared the GEMV with itself)");
    }
    size_t differ = 0;
    for (size_t i = 0; i < out[0].size(); ++i) differ += std::memcmp(&out[0][i], &out[1][i], 4) != 0;
    if (differ) {
      fail("int8 tensor-core matmul " + std::string(dtype_traits(t).name) + " at " + std::to_string(nq) + " tokens: " +
           std::to_string(differ) + " of " + std::to_string(out[0].size()) + " outputs differ from the GEMV's bits");
    }
  }
}

// The batch-invariant tensor-core matmul (--cuda-tc-gemm) at decode batch sizes, as the
// GEMV rows: weight bytes streamed per call against the copy bandwidth.
void bench_tc_decode(double copy_gbs) {
  CudaBackendOptions o;
  o.tc_gemm = true;
  auto be = make_cuda_backend(o);
  need(be);
  std::mt19937 rng(3);
  const int64_t rows = S.rows, cols = S.cols;
  auto v = random_bf16(size_t(rows) * cols, 0.02f);
  const size_t bytes = v.size() * 2;
  const size_t copies = S.stream_bytes / bytes + 1;
  std::vector<std::unique_ptr<Weight>> ws;
  for (size_t i = 0; i < copies; ++i) {
    auto w = (*be)->make_weight(DType::BF16, cols, {{v.data(), rows}});
    need(w);
    ws.push_back(std::move(*w));
  }
  float* x = (*be)->upload(test::random_floats(size_t(cols) * 64, rng));
  float* y = (*be)->alloc(size_t(rows) * 64);
  for (int64_t n : {1, 8, 16, 64}) {
    size_t k = 0;
    const double ms = time_ms(**be, [&] { (*be)->matmul(*ws[k++ % copies], x, n, y, rows); });
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    add({"matmul bf16 (batch-invariant tensor cores)", "14336x4096, n=" + std::to_string(n), ms, gbs, "GB/s",
         100.0 * gbs / copy_gbs, "copy"});
  }
}

// Attention over a paged cache: B sequences of `ctx` tokens; decode (1 query each) or one
// prefill of ctx tokens. Llama-3-8B heads: 32 query, 8 KV, head_dim 128.
void bench_attention(double copy_gbs, double peak_tflops) {
  const int32_t nh = S.attn_heads, nkv = S.attn_kv_heads, hd = 128, bs = 16;
  // Each kernel: decode (16 sequences) or prefill, TROUPE_CUDA_ATTN, batch-invariant or
  // --cuda-cublas. K rows staged or read directly (the same bits: which is faster decides
  // the default); every token on tensor cores, batch-invariant (opt-in until these rows
  // decide), with the mma.sync kernel (tc) or the WMMA one (wmma); and --cuda-cublas's
  // prefill tiles on either.
  struct Kind {
    const char* what;
    const char* attn;
    bool invariant, decode;
  };
  const Kind kinds[] = {
      {"decode attention (paged, f16 KV, K staged)", nullptr, true, true},
      {"decode attention (paged, f16 KV, K read directly)", "direct", true, true},
      {"decode attention (tensor cores, batch-invariant, mma.sync, TROUPE_CUDA_ATTN=tc)", "tc", true, true},
      {"decode attention (tensor cores, batch-invariant, WMMA, TROUPE_CUDA_ATTN=wmma)", "wmma", true, true},
      {"prefill attention (paged, causal)", nullptr, true, false},
      {"prefill attention (tensor cores, batch-invariant, mma.sync, TROUPE_CUDA_ATTN=tc)", "tc", true, false},
      {"prefill attention (tensor cores, batch-invariant, WMMA, TROUPE_CUDA_ATTN=wmma)", "wmma", true, false},
      {"prefill attention (tensor cores, mma.sync, --cuda-cublas)", nullptr, false, false},
      {"prefill attention (tensor cores, WMMA, --cuda-cublas, TROUPE_CUDA_ATTN=wmma)", "wmma", false, false},
  };
  for (const Kind& kind : kinds) {
    if (kind.attn) setenv("TROUPE_CUDA_ATTN", kind.attn, 1);
    auto be = make_cuda_backend(CudaBackendOptions{0, kind.invariant});
    unsetenv("TROUPE_CUDA_ATTN");
    need(be);
    const bool decode = kind.decode;
    const int32_t B = decode ? S.attn_seqs : 1, ctx = S.attn_ctx, per_seq = decode ? 1 : ctx;
    const int32_t blocks_per_seq = ctx / bs;
    KvCacheShape ks{1, B * blocks_per_seq, bs, nkv, hd};
    auto cache = (*be)->make_kv_cache(ks);
    need(cache);
    std::vector<int32_t> ids, pos, slots, qs = {0}, cl, bt;
    for (int32_t s = 0; s < B; ++s) {
      for (int32_t b = 0; b < blocks_per_seq; ++b) bt.push_back(s * blocks_per_seq + b);
      for (int32_t p = ctx - per_seq; p < ctx; ++p) {
        ids.push_back(1);
        pos.push_back(p);
        slots.push_back(bt[size_t(s) * blocks_per_seq + p / bs] * bs + p % bs);
      }
      qs.push_back(int32_t(pos.size()));
      cl.push_back(ctx);
    }
    StepInputs st;
    st.num_tokens = int32_t(pos.size());
    st.num_seqs = B;
    st.token_ids = ids.data();
    st.positions = pos.data();
    st.query_start = qs.data();
    st.context_lens = cl.data();
    st.slot_mapping = slots.data();
    st.block_tables = bt.data();
    st.max_blocks_per_seq = blocks_per_seq;
    (*be)->begin_step(st);
    std::mt19937 rng(3);
    float* q = (*be)->upload(test::random_floats(size_t(st.num_tokens) * nh * hd, rng));
    float* o = (*be)->alloc(size_t(st.num_tokens) * nh * hd);
    const double ms = time_ms(**be, [&] { (*be)->attention(**cache, 0, q, nh * hd, nh, 0.088f, o); });
    const bool tc_kind = kind.attn && (!std::strcmp(kind.attn, "tc") || !std::strcmp(kind.attn, "wmma"));
    if (tc_kind && kind.invariant &&
        (*be)->stats().find("batch-invariant attention on tensor cores: 0;") != std::string::npos)
      fail(kind.what + std::string(": the tensor-core kernel did not run"));
    if (decode) {
      const double bytes = 2.0 * B * ctx * nkv * hd * 2;  // K and V, f16
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      add({kind.what, "16 seqs x 4096 ctx, 32/8 heads, hd 128", ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
    } else {
      const double flops = 4.0 * nh * hd * (double(ctx) * (ctx + 1) / 2);  // causal QK^T and PV
      const double tf = flops / (ms * 1e-3) / 1e12;
      add({kind.what, "4096 tokens, 32/8 heads, hd 128", ms, tf, "TFLOP/s", 100.0 * tf / peak_tflops, "bf16 GEMM"});
    }
  }
}

// Returns what the bf16 copy adds to rms_norm's time (ms, >= 0), for the prefill matmul's row.
double bench_small_ops(double copy_gbs) {
  auto be = make_cuda_backend({});
  need(be);
  std::mt19937 rng(4);
  const int64_t n = S.tokens, dim = S.cols;
  float* x = (*be)->upload(test::random_floats(size_t(n * dim), rng));
  float* w = (*be)->upload(test::random_floats(size_t(dim), rng));
  float* y = (*be)->alloc(size_t(n * dim));
  double ms = time_ms(**be, [&] { (*be)->rms_norm(x, w, 1e-5f, n, dim, y); });
  double norm_copy_ms = 0;
  double gbs = 2.0 * n * dim * 4 / (ms * 1e-3) / 1e9;
  add({"rms_norm", "2048 x 4096 f32", ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
  {  // The same norm also writing its output in bf16 for the cuBLAS matmul that reads it next
     // (--cuda-cublas), which must then take it.
    auto cb = make_cuda_backend(CudaBackendOptions{0, false});
    need(cb);
    auto wv = random_bf16(size_t(dim) * dim, 0.02f);
    auto next = (*cb)->make_weight(DType::BF16, dim, {{wv.data(), dim}});
    need(next);
    float* cx = (*cb)->upload(test::random_floats(size_t(n * dim), rng));
    float* cw = (*cb)->upload(test::random_floats(size_t(dim), rng));
    float* cy = (*cb)->alloc(size_t(n * dim));
    float* cz = (*cb)->alloc(size_t(n * dim));
    // (the copy's cost: with it less without, on this backend and these buffers both)
    const double plain_ms = time_ms(**cb, [&] { (*cb)->rms_norm(cx, cw, 1e-5f, n, dim, cy); });
    ms = time_ms(**cb, [&] { (*cb)->rms_norm(cx, cw, 1e-5f, n, dim, cy, next->get()); });
    norm_copy_ms = std::max(0.0, ms - plain_ms);
    // (time_ms ends with a sync, an op of its own: the matmul must follow a norm directly)
    (*cb)->rms_norm(cx, cw, 1e-5f, n, dim, cy, next->get());
    (*cb)->matmul(**next, cy, n, cz, dim);
    if (std::string st = (*cb)->stats(); st.find("cuBLAS inputs in half from the op before: 1 ") == std::string::npos) {
      fail("rms_norm: its bf16 copy was not taken by the matmul after it (" + st + ")");
    }
    gbs = (2.0 + 0.5) * n * dim * 4 / (ms * 1e-3) / 1e9;
    add({"rms_norm, bf16 copy for cuBLAS too", "2048 x 4096 f32", ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
  }
  const int64_t ffn = S.rows;
  float* gu = (*be)->upload(test::random_floats(size_t(n) * 2 * ffn, rng));
  float* act = (*be)->alloc(size_t(n) * std::max(ffn, dim));  // (also add_rms_norm's output below)
  ms = time_ms(**be, [&] { (*be)->silu_mul(gu, n, ffn, act); });
  gbs = 3.0 * n * ffn * 4 / (ms * 1e-3) / 1e9;
  add({"silu_mul", "2048 x 14336 f32", ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
  // The fused residual add + norm (reads x and y, writes x and out).
  float* r = (*be)->upload(test::random_floats(size_t(n * dim), rng));
  ms = time_ms(**be, [&] { (*be)->add_rms_norm(y, r, w, 1e-5f, n, dim, act); });
  gbs = 4.0 * n * dim * 4 / (ms * 1e-3) / 1e9;
  add({"add_rms_norm (fused)", "2048 x 4096 f32", ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
  // On-device sampling over Llama-3's vocabulary: greedy, and top-p 0.9 at T 0.8 (time per
  // call, tokens back to the host included).
  const int64_t vocab = S.vocab;
  for (int64_t b : {int64_t{1}, S.sample_batch}) {
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> lg(size_t(b * vocab));
    for (auto& v : lg) v = nd(rng);
    float* dl = (*be)->upload(lg);
    for (float temp : {0.0f, 0.8f}) {
      std::vector<DeviceSampleParams> ps(static_cast<size_t>(b));
      for (auto& p : ps) {
        p.temperature = temp;
        p.top_p = temp > 0 ? 0.9f : 1.0f;
        p.seed = 5;
        p.want_logprob = 1;
      }
      std::vector<int32_t> tok(static_cast<size_t>(b));
      std::vector<float> lp(static_cast<size_t>(b));
      if (auto st = (*be)->sample(dl, b, vocab, ps.data(), tok.data(), lp.data()); !st.ok()) {
        fail("sample on device: " + st.error().message);
        continue;
      }
      ms = time_ms(**be, [&] { (void)(*be)->sample(dl, b, vocab, ps.data(), tok.data(), lp.data()); });
      gbs = double(b) * vocab * 4 / (ms * 1e-3) / 1e9;
      add({temp > 0 ? "sample on device (T 0.8, top-p 0.9)" : "sample on device (greedy)",
           "batch " + std::to_string(b) + " x vocab 128256", ms, gbs, "GB/s", -1, ""});
    }
  }
  return norm_copy_ms;
}

}  // namespace

int gpu_bench::run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: troupe_gpu_bench OUT_DIR [--config configs/llama-3-8b.json] [--skip-e2e] [--smoke]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::string config = "configs/llama-3-8b.json";
  bool e2e = true;
  S = Sizes{};
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc)
      config = argv[++i];
    else if (!std::strcmp(argv[i], "--skip-e2e"))
      e2e = false;
    else if (!std::strcmp(argv[i], "--smoke"))
      S = Sizes::smoke();
  }
  rows.clear();
  out = json::object();
  failures.clear();
  if (std::string why = cuda_unavailable_reason(); !why.empty()) {
    std::fprintf(stderr, "troupe_gpu_bench: %s\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  std::printf("device: %s, %d SMs, %.1f GiB, driver %d, runtime %d\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30), drv, rt);
  out["device"] = prop.name;
  out["sms"] = prop.multiProcessorCount;
  out["memory_gib"] = prop.totalGlobalMem / double(1 << 30);
  const double copy = copy_bandwidth();
  cublasHandle_t h;
  cublasCreate(&h);
  const GemmTime peak_t = cublas_time(h, S.gemm, S.gemm, S.gemm, CUDA_R_16BF);
  cublasDestroy(h);
  const double peak = peak_t.tflops(S.gemm, S.gemm, S.gemm, peak_t.ms);
  add({"ceiling: cuBLAS bf16 GEMM", "8192^3", peak_t.ms, peak, "TFLOP/s", -1, ""});
  add({"(not a ceiling) the same GEMM, a burst of 10", "8192^3", peak_t.burst_ms,
       peak_t.tflops(S.gemm, S.gemm, S.gemm, peak_t.burst_ms), "TFLOP/s", -1, ""});
  g_dir = dir;
  g_prop = prop;
  // Kernels the H200 run measured first, kernels written since last: a fault on the device
  // ends the process (its context is lost), and the rows before it are on disk already.
  bench_gemv(copy, false);
  const double norm_copy_ms = bench_small_ops(copy);
  bench_gemv_silu(copy);
  if (e2e) {
    auto cfg = read_hf_config(config);
    if (!cfg) {
      std::fprintf(stderr, "%s\n", cfg.error().message.c_str());
      return 1;
    }
    bench_decode_parts(*cfg, copy);
    bench_end_to_end(*cfg, copy);
  }
  bench_attention(copy, peak);
  bench_prefill_matmul(norm_copy_ms);
  bench_gemv(copy, true);  // the f32-activation kernel for every type, for comparison
  bench_tc_decode(copy);
  write_outputs(/*last=*/true);
  std::printf("wrote %s/gpu-check.md and gpu-check.json\n", dir.c_str());
  for (const auto& f : failures) std::fprintf(stderr, "FAILED: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

namespace gpu_bench {
// OUT_DIR/gpu-check.md and .json: the rows so far, the Targets table and the failures.
void write_outputs(bool last) {
  if (g_dir.empty()) return;
  const std::string& dir = g_dir;
  const cudaDeviceProp& prop = g_prop;
  std::ofstream md(dir + "/gpu-check.md");
  md << "Device: " << prop.name << " (" << prop.multiProcessorCount << " SMs, " << (prop.totalGlobalMem >> 30)
     << " GiB)\n\n| what | shape | time (ms) | rate | unit | % of ceiling |\n|---|---|---:|---:|---|---|\n";
  json jr = json::array();
  for (const auto& r : rows) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f%% of %s", r.pct, r.of.c_str());
    md << "| " << r.what << " | " << r.shape << " | " << r.ms << " | " << r.rate << " | " << r.unit << " | "
       << (r.pct >= 0 ? buf : "") << " |\n";
    jr.push_back({{"what", r.what},
                  {"shape", r.shape},
                  {"ms", r.ms},
                  {"rate", r.rate},
                  {"unit", r.unit},
                  {"pct", r.pct},
                  {"of", r.of}});
  }
  out["rows"] = jr;
  const double parts_ms = out.contains("decode_parts_ms") ? out["decode_parts_ms"].get<double>() : -1;
  out["targets"] = gpu_bench::targets_table(rows, parts_ms, md, /*print=*/last);
  out["failures"] = failures;
  for (const auto& f : failures) md << "\nFAILED: " << f << "\n";
  std::ofstream(dir + "/gpu-check.json") << out.dump(2) << "\n";
}
}  // namespace gpu_bench
