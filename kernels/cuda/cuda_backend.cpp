// The CUDA backend: device-resident weights (GGUF blocks kept quantized), f16 paged KV
// cache (both in device_memory.h), one stream, cuBLAS for prefill matmuls and fused
// dequant-GEMV for decode. Host code only (compiled by the C++ compiler); the kernels live
// in the .cu files (ops.h).
// Every CUDA and cuBLAS call is checked; the first failure is kept with its call, file
// and line, later ops are skipped, and sync() returns it as the step's error. Steps of up
// to graph_max_tokens tokens are recorded and replayed as CUDA graphs (step_graph.h).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/attention_path.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/prepared.h"
#include "kernels/cuda/step_graph.h"
#include "kernels/cuda/step_pack.h"

// Inside CudaBackend: records the first failure with the call's text, file and line.
#define TROUPE_CUDA(call) check((call), #call, __FILE__, __LINE__)
#define TROUPE_CUBLAS(call) check_blas((call), #call, __FILE__, __LINE__)

namespace troupe {
namespace {

using cuda::CudaKvCache;
using cuda::CudaWeight;

// Decode batches up to this many tokens use the fused GEMV; larger ones cuBLAS unless the
// backend is batch-invariant.
constexpr int64_t kGemvMaxTokens = 8;
constexpr int kMaxGridZ = 65535;  // split-KV: a block per segment in the grid's z
// Split-KV partials needed by a step, at most (64 MB for the exact segment count, times
// attention_segments()'s 1.5); the buffer itself may be half as large again (ensure()).
constexpr size_t kMaxPartialBytes = size_t{96} << 20;

class CudaBackend final : public Backend {
 public:
  CudaBackend(const CudaBackendOptions& opts, const CudaEnvOptions& env, cudaStream_t stream, cublasHandle_t blas,
              std::string name)
      : device_(opts.device),
        batch_invariant_(opts.batch_invariant),
        tc_gemm_(opts.batch_invariant && opts.tc_gemm),
        simple_gemv_(env.simple_gemv),
        direct_k_(env.direct_k),
        fuse_(env.fuse),
        q8_mma_min_(env.q8_mma_min),
        tc_attention_(env.tc_attention),
        wmma_attention_(env.wmma_attention),
        stream_(stream),
        blas_(blas),
        name_(std::move(name)) {
    graph_max_tokens_ = std::max(0, opts.graph_max_tokens);
    cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_);
    cudaDeviceGetAttribute(&max_shared_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_);
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_);
    if (major < 8) q8_mma_min_ = 0;  // (mma.sync m16n8k32 needs sm_80)
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (void* p : buffers_) cudaFree(p);
    graphs_.clear();
    for (void* p : {static_cast<void*>(step_dev_), idx_dev_, wh_, xh_, partials_, xq_, xq2_, done_, sample_dev_})
      if (p) cudaFree(p);
    if (step_host_) cudaFreeHost(step_host_);
    if (arena_) cudaFreeHost(arena_);
    if (sample_host_) cudaFreeHost(sample_host_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return name_; }
  std::string stats() const override {
    return "cuda graphs: " + std::to_string(graphs_.num_graphs()) + " held, " + std::to_string(graphs_.replays()) +
           " replays, " + std::to_string(graphs_.capture_failures()) +
           " failed captures (run eagerly); fused GEMV epilogues: " + std::to_string(fused_calls_) +
           "; activations quantized for the next matmul (by norms, attention, SiLU): " +
           std::to_string(acts_.q8_made()) + "; used by the next matmul: " + std::to_string(acts_.q8_used()) +
           "; int8 matmuls on tensor cores: " + std::to_string(q8_mma_calls_) +
           "; batch-invariant attention on tensor cores: " + std::to_string(tc_attention_calls_) +
           "; prefill tiles' attention on mma.sync: " + std::to_string(mma_attention_calls_) +
           "; cuBLAS inputs in half from the op before: " + std::to_string(acts_.half_taken(true)) +
           " (converted: " + std::to_string(acts_.half_taken(false)) + ")";
  }
  bool is_host_memory() const override { return false; }

  Result<std::unique_ptr<Weight>> make_weight(DType type, int64_t cols,
                                              const std::vector<std::pair<const void*, int64_t>>& parts) override {
    flush();          // (what is recorded runs first: the upload below is in stream order after it)
    graphs_.clear();  // (a recorded launch may name a freed weight's address, now another's)
    auto w = cuda::upload_weight(device_, stream_, type, cols, parts);
    if (!w.ok()) return w.error();
    max_weight_elems_ = std::max(max_weight_elems_, static_cast<size_t>((*w)->rows) * static_cast<size_t>(cols));
    return std::unique_ptr<Weight>(std::move(*w));
  }
  Result<std::unique_ptr<KvCache>> make_kv_cache(const KvCacheShape& s) override {
    flush();
    graphs_.clear();
    auto c = cuda::allocate_kv_cache(device_, stream_, s);
    if (!c.ok()) return c.error();
    return std::unique_ptr<KvCache>(std::move(*c));
  }

  float* alloc(size_t n) override {
    void* p = nullptr;
    cudaSetDevice(device_);
    if (!check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)), "cudaMalloc(activations)", __FILE__, __LINE__))
      return nullptr;
    buffers_.push_back(p);
    return static_cast<float*>(p);
  }

  // (Every entry a step or a model build can start with makes this backend's GPU current:
  // the stages of one process may sit on different GPUs and share threads.)
  void copy_in(float* dst, const float* src, size_t n) override {
    ++op_seq_;
    cudaSetDevice(device_);
    if (failed() || !n) return;
    if (graphs_.recording()) {
      if (void* staged = stage(src, n * sizeof(float))) {
        run("copy_in", __LINE__, {P(dst), P(staged), n}, [=](cudaStream_t st) {
          return cudaMemcpyAsync(dst, staged, n * sizeof(float), cudaMemcpyHostToDevice, st);
        });
        return;
      }
      flush();  // too large to stage: copy eagerly, after what is pending
    }
    check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync(H2D)",
          __FILE__, __LINE__);
  }
  void copy_out(float* dst, const float* src, size_t n) override {
    cudaSetDevice(device_);
    flush();
    if (failed() || !n) return;
    if (check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync(D2H)",
              __FILE__, __LINE__))
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", __FILE__, __LINE__);
    arena_off_ = 0;  // the queue is empty: staged data may be overwritten
  }
  Status sync() override {
    cudaSetDevice(device_);
    flush();
    graphs_.set_recording(false);
    if (!failed()) check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", __FILE__, __LINE__);
    arena_off_ = 0;
    if (failed()) return make_error("CUDA: " + error_);
    return {};
  }

  void begin_step(const StepInputs& s) override {
    ++op_seq_;
    cudaSetDevice(device_);
    flush();
    if (failed()) return;
    step_ = s;
    // The previous step's work (and its reads of pinned buffers) must be done first.
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", __FILE__, __LINE__);
    arena_off_ = 0;
    // One packed upload (step_pack.h).
    const cuda::StepLayout layout = cuda::step_layout(s);
    const size_t total = layout.total;
    if (total > step_cap_) {
      if (step_host_) cudaFreeHost(step_host_);
      if (step_dev_) cudaFree(step_dev_);
      step_host_ = nullptr;
      step_dev_ = nullptr;
      step_cap_ = 0;
      graphs_.clear();
      if (!check(cudaMallocHost(reinterpret_cast<void**>(&step_host_), total * 4), "cudaMallocHost(step)", __FILE__,
                 __LINE__) ||
          !check(cudaMalloc(reinterpret_cast<void**>(&step_dev_), total * 4), "cudaMalloc(step)", __FILE__, __LINE__))
        return;
      step_cap_ = total;
    }
    dstep_ = cuda::device_step(s, layout, step_dev_, cuda::pack_step(s, layout, step_host_));
    // Decode-sized steps are recorded and replayed as CUDA graphs; not a step whose matmuls
    // go through cuBLAS (--cuda-cublas above kGemvMaxTokens): each cuBLAS call would cut
    // its launches into a graph per piece.
    graphs_.set_recording(graph_max_tokens_ > 0 && s.num_tokens <= graph_max_tokens_ &&
                          (batch_invariant_ || s.num_tokens <= kGemvMaxTokens));
    int32_t* dev = step_dev_;
    const int32_t* host = step_host_;
    run("step upload", __LINE__, {P(dev), P(host), total},
        [=](cudaStream_t st) { return cudaMemcpyAsync(dev, host, total * 4, cudaMemcpyHostToDevice, st); });
  }

  void embed(const Weight& table, const int32_t* ids, int64_t n, float* out) override {
    if (failed()) return;
    const auto& w = static_cast<const CudaWeight&>(table);
    const int32_t* dev_ids =
        ids == step_.token_ids && n <= step_.num_tokens ? dstep_.token_ids : upload_indices(ids, n);
    if (!dev_ids) return;
    const DType type = w.type;
    const void* data = w.data;
    const size_t rb = w.row_bytes;
    const int64_t cols = w.cols;
    run("embed", __LINE__, {P(data), rb, U(cols), P(dev_ids), U(n), P(out)},
        [=](cudaStream_t st) { return cuda::embed(type, data, rb, cols, dev_ids, n, out, st); });
  }
  void rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out,
                const Weight* next = nullptr) override {
    cuda::Q8Numerics nq;
    uint8_t* xq = q8_for(next, n, dim, &nq);
    const cuda::HalfOut xh = half_for(next, n, dim);
    run("rms_norm", __LINE__, {P(x), P(w), F(eps), U(n), U(dim), P(out), P(xq), Q(nq), P(xh.p), U(xh.bf16)},
        [=](cudaStream_t st) { return cuda::rms_norm(x, w, eps, n, dim, out, st, xq, nq, xh); });
    prepared(out, n, dim, nq, xq, xh);
  }
  void matmul(const Weight& weight, const float* x, int64_t n, float* y, int64_t ldy) override {
    if (failed() || n <= 0) return;
    const auto& w = static_cast<const CudaWeight&>(weight);
    const DType type = w.type;
    const void* data = w.data;
    const size_t rb = w.row_bytes;
    const int64_t rows = w.rows, cols = w.cols;
    const std::initializer_list<uint64_t> key = {P(data), rb, U(rows), U(cols), P(x), U(n), P(y), U(ldy)};
    const MatmulPath path = matmul_path(type, n);
    if (path == MatmulPath::kTensorCores) {
      // Tensor cores at every batch size, batch-invariant (matmul_tc.cu); capturable.
      if (!ensure(&xh_, &xh_cap_, cuda::gemm_tc_scratch_bytes(rb, n))) return;
      void* xh = xh_;
      run("gemm_tc", __LINE__, {P(data), rb, U(rows), U(cols), P(x), U(n), P(y), U(ldy), P(xh)},
          [=](cudaStream_t st) { return cuda::gemm_tc(type, data, rb, rows, cols, x, cols, n, xh, y, ldy, st); });
      return;
    }
    if (path == MatmulPath::kGemvQ8) {
      // As the CPU and llama.cpp: int8 activations per 32 values, integer dot products
      // (quantized here, or already by the norm that wrote x).
      uint8_t* const given = acts_.take_q8(x, n, cols, op_seq_, cuda::q8_numerics(type));
      const bool ready = given != nullptr;
      uint8_t* xq = ready ? given : q8_scratch(n, cols);
      if (!xq) return;
      const int64_t mma_min = q8_mma_min_;
      if (q8_on_tensor_cores(n)) ++q8_mma_calls_;
      run("quantize_q8 + gemv_q8", __LINE__, {P(data), rb, U(rows), U(cols), P(x), U(n), P(y), U(ldy), P(xq), U(ready)},
          [=](cudaStream_t st) {
            const cudaError_t e = ready ? cudaSuccess : cuda::quantize_q8(type, x, cols, cols, n, xq, st);
            return e != cudaSuccess ? e : cuda::gemv_q8(type, data, rb, rows, cols, xq, n, y, ldy, st, mma_min);
          });
      return;
    }
    if (path == MatmulPath::kGemv) {
      const bool simple = simple_gemv_;
      run("gemv", __LINE__, key,
          [=](cudaStream_t st) { return cuda::gemv(type, data, rb, rows, cols, x, cols, n, y, ldy, st, simple); });
      return;
    }
    // cuBLAS: never captured; what is pending runs first, then this, eagerly. x in half:
    // written by the op before (a norm, attention, SiLU, a matmul of the same x) or converted here.
    const bool bf16 = type == DType::BF16;
    const bool given = type != DType::F32 && acts_.take_half(x, n, cols, op_seq_, {xh_, bf16});
    flush();
    if (failed()) return;
    const float one = 1.0f, zero = 0.0f;
    const int m = static_cast<int>(rows), k = static_cast<int>(cols), nn = static_cast<int>(n);
    if (type == DType::F32) {
      TROUPE_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, static_cast<const float*>(data),
                                static_cast<int>(rb / 4), x, k, &zero, y, static_cast<int>(ldy)));
      return;
    }
    const cudaDataType_t ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    if (!given && (!ensure(&xh_, &xh_cap_, static_cast<size_t>(n * k) * 2) ||
                   !TROUPE_CUDA(cuda::to_half_rows(x, k, n, k, k, n, xh_, bf16, stream_))))
      return;
    const void* a = data;
    int lda = static_cast<int>(rb / 2);
    if (type != DType::F16 && !bf16) {  // quantized: dequantize to f16 first
      if (!ensure(&wh_, &wh_cap_, max_weight_elems_ * 2)) return;
      TROUPE_CUDA(cuda::dequant_to_f16(type, data, rb, rows, cols, wh_, stream_));
      a = wh_;
      lda = k;
    }
    TROUPE_CUBLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, a, ht, lda, xh_, ht, k, &zero, y,
                               CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (fuse_) prepared(x, n, cols, {}, nullptr, {xh_, bf16});  // (a next matmul of x, unfused Q K V, takes it too)
  }
  void add_bias(float* y, int64_t ld, const float* bias, int64_t n, int64_t dim) override {
    run("add_bias", __LINE__, {P(y), U(ld), P(bias), U(n), U(dim)},
        [=](cudaStream_t st) { return cuda::add_bias(y, ld, bias, n, dim, st); });
  }
  void rope(float* x, int64_t ld, int64_t n, int64_t num_heads, int64_t head_dim, const float* cos_sin,
            RopeKind kind) override {
    const bool neox = kind == RopeKind::Neox;
    run("rope", __LINE__, {P(x), U(ld), U(n), U(num_heads), U(head_dim), P(cos_sin), U(neox)},
        [=](cudaStream_t st) { return cuda::rope(x, ld, n, num_heads, head_dim, cos_sin, neox, st); });
  }
  void kv_write(KvCache& cache, int32_t layer, const float* k, const float* v, int64_t ld) override {
    if (failed()) return;
    auto& c = static_cast<CudaKvCache&>(cache);
    const int64_t row = int64_t{c.shape_.num_kv_heads} * c.shape_.head_dim;
    uint16_t* kc = c.k + c.layer_elems * layer;
    uint16_t* vc = c.v + c.layer_elems * layer;
    const cuda::DeviceStep ds = dstep_;
    run("kv_write", __LINE__, {step_key(), P(k), P(v), U(ld), U(row), P(kc), P(vc)},
        [=](cudaStream_t st) { return cuda::kv_write(ds, k, v, ld, row, kc, vc, st); });
  }
  void attention(KvCache& cache, int32_t layer, const float* q, int64_t ld_q, int32_t num_heads, float scale,
                 float* out, const Weight* next = nullptr) override {
    if (failed()) return;
    auto& c = static_cast<CudaKvCache&>(cache);
    // Split-KV when the looped path's blocks (a token and up to four query heads of a KV
    // head each: 16 decoding sequences of a 32/8-head model are 128 blocks) would give a
    // multiprocessor fewer than four and the context spans several segments: the same bits.
    // The partials (written and read once: about 1/32 of the KV bytes for four query heads
    // per KV head) are capped at kMaxPartialBytes; where refused, the looped path runs.
    // Tensor-core kernels where attention_path() says: --cuda-cublas prefill tiles, or every
    // token in the batch-invariant mode with TROUPE_CUDA_ATTN=tc or wmma (split-KV as below,
    // the same bits either way; every step takes the same kernel).
    const int32_t hd = c.shape_.head_dim;
    const cuda::AttentionPath path = cuda::attention_path(
        {batch_invariant_, tc_attention_, wmma_attention_, dstep_.num_tokens, hd, max_shared_optin_});
    const bool tc = path.tiles, mma = path.tiles && path.mma, tc_all = path.every_token;
    float* partials = nullptr;
    const int segs = cuda::attention_segments(dstep_.max_context);
    const size_t floats = size_t(dstep_.num_tokens) * num_heads * segs * (hd + 2);
    if (!tc && segs > 1 && segs <= kMaxGridZ && floats * sizeof(float) <= kMaxPartialBytes &&
        floats * sizeof(float) < partials_denied_ &&
        cuda::attention_loop_blocks(dstep_.num_tokens, num_heads, c.shape_.num_kv_heads) < 4 * int64_t{num_sms_}) {
      if (ensure(&partials_, &partials_cap_, floats * sizeof(float), /*optional=*/true))
        partials = static_cast<float*>(partials_);
      else  // (not asked for again at this size or larger: the looped path gives the same bits)
        partials_denied_ = floats * sizeof(float);
    }
    const cuda::DeviceStep ds = dstep_;
    const int32_t nkv = c.shape_.num_kv_heads, bs = c.shape_.block_size;
    const uint16_t* kc = c.k + c.layer_elems * layer;
    const uint16_t* vc = c.v + c.layer_elems * layer;
    if (tc_all) {
      ++tc_attention_calls_;
      const bool mma_all = path.mma;
      run(mma_all ? "attention_mma_invariant" : "attention_tc_invariant", __LINE__,
          {step_key(), P(q), U(ld_q), U(num_heads), U(nkv), U(hd), U(bs), F(scale), P(kc), P(vc), P(out), P(partials),
           U(mma_all)},
          [=](cudaStream_t st) {
            return (mma_all ? cuda::attention_mma_invariant : cuda::attention_tc_invariant)(
                ds, q, ld_q, num_heads, nkv, hd, bs, scale, kc, vc, out, partials, st);
          });
      return;
    }
    mma_attention_calls_ += mma;
    // The O projection reads out next. Its int8 GEMV: the kernel quantizes out on the way
    // (not with a tensor-core kernel, which writes some of the tokens); cuBLAS: the kernels
    // write it in half too.
    const int64_t dim = int64_t{num_heads} * hd;
    const cuda::HalfOut xh = half_for(next, dstep_.num_tokens, dim);
    if (tc)
      run(mma ? "attention_mma" : "attention_tc", __LINE__,
          {step_key(), P(q), U(ld_q), U(num_heads), U(nkv), U(hd), U(bs), F(scale), P(kc), P(vc), P(out), U(mma),
           P(xh.p), U(xh.bf16)},
          [=](cudaStream_t st) {
            return mma ? cuda::attention_mma(ds, q, ld_q, num_heads, nkv, hd, bs, scale, kc, vc, out, st, xh)
                       : cuda::attention_tc(ds, q, ld_q, num_heads, nkv, hd, bs, scale, kc, vc, out, st, xh);
          });
    const bool direct = direct_k_;
    cuda::Q8Numerics nq;
    uint8_t* xq = tc ? nullptr : q8_for(next, dstep_.num_tokens, dim, &nq);
    run("attention", __LINE__,
        {step_key(), P(q), U(ld_q), U(num_heads), U(nkv), U(hd), U(bs), F(scale), P(kc), P(vc), P(out), P(partials),
         U(tc), P(xq), Q(nq), P(xh.p), U(xh.bf16)},
        [=](cudaStream_t st) {
          return cuda::attention(ds, q, ld_q, num_heads, nkv, hd, bs, scale, kc, vc, out, partials, st, tc, direct, xq,
                                 nq, xh);
        });
    prepared(out, dstep_.num_tokens, dim, nq, xq, xh);
  }
  // (next: the matmul that reads out, which may take it in half from here: cuBLAS)
  void silu_mul(const float* gate_up, int64_t n, int64_t ffn, float* out, const Weight* next = nullptr) override {
    const cuda::HalfOut xh = half_for(next, n, ffn);
    run("silu_mul", __LINE__, {P(gate_up), U(n), U(ffn), P(out), P(xh.p), U(xh.bf16)},
        [=](cudaStream_t st) { return cuda::silu_mul(gate_up, n, ffn, out, st, xh); });
    prepared(out, n, ffn, {}, nullptr, xh);
  }
  void add(float* x, const float* y, int64_t count) override {
    run("add", __LINE__, {P(x), P(y), U(count)}, [=](cudaStream_t st) { return cuda::add(x, y, count, st); });
  }
  bool can_sample() const override { return true; }
  Status sample(const float* logits, int64_t n, int64_t vocab, const DeviceSampleParams* params, int32_t* tokens,
                float* logprobs) override {
    cudaSetDevice(device_);
    flush();
    if (!failed() && n > 0) {
      const size_t in = static_cast<size_t>(n) * sizeof(DeviceSampleParams), out = static_cast<size_t>(n) * 8;
      if (in + out > sample_host_cap_) {
        if (sample_host_) cudaFreeHost(sample_host_);
        sample_host_ = nullptr;
        sample_host_cap_ = 0;
        if (check(cudaMallocHost(&sample_host_, in + out), "cudaMallocHost(sampling)", __FILE__, __LINE__))
          sample_host_cap_ = in + out;
      }
      if (sample_host_cap_ >= in + out && ensure(&sample_dev_, &sample_dev_cap_, in + out)) {
        auto* host = static_cast<uint8_t*>(sample_host_);
        auto* dev = static_cast<uint8_t*>(sample_dev_);
        std::memcpy(host, params, in);
        auto* dev_params = reinterpret_cast<const DeviceSampleParams*>(dev);
        auto* dev_tokens = reinterpret_cast<int32_t*>(dev + in);
        auto* dev_logprobs = reinterpret_cast<float*>(dev + in + static_cast<size_t>(n) * 4);
        if (TROUPE_CUDA(cudaMemcpyAsync(dev, host, in, cudaMemcpyHostToDevice, stream_)) &&
            TROUPE_CUDA(cuda::sample(logits, n, vocab, dev_params, dev_tokens, dev_logprobs, stream_)) &&
            TROUPE_CUDA(cudaMemcpyAsync(host + in, dev + in, out, cudaMemcpyDeviceToHost, stream_)) &&
            TROUPE_CUDA(cudaStreamSynchronize(stream_))) {
          std::memcpy(tokens, host + in, static_cast<size_t>(n) * 4);
          std::memcpy(logprobs, host + in + static_cast<size_t>(n) * 4, static_cast<size_t>(n) * 4);
        }
      }
    }
    if (failed()) return make_error("CUDA: " + error_);
    return {};
  }
  void add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                    const Weight* next = nullptr) override {
    cuda::Q8Numerics nq;
    uint8_t* xq = q8_for(next, n, dim, &nq);
    const cuda::HalfOut xh = half_for(next, n, dim);
    run("add_rms_norm", __LINE__, {P(x), P(y), P(w), F(eps), U(n), U(dim), P(out), P(xq), Q(nq), P(xh.p), U(xh.bf16)},
        [=](cudaStream_t st) { return cuda::add_rms_norm(x, y, w, eps, n, dim, out, st, xq, nq, xh); });
    prepared(out, n, dim, nq, xq, xh);
  }
  void rope_kv_write(KvCache& cache, int32_t layer, float* qkv, int64_t ld, int64_t n, int32_t num_heads,
                     int32_t num_kv_heads, int64_t head_dim, const float* cos_sin, RopeKind kind) override {
    if (failed()) return;
    auto& c = static_cast<CudaKvCache&>(cache);
    // The kernel writes one cache row per step token; other shapes take the unfused ops.
    if (n != dstep_.num_tokens || num_kv_heads != c.shape_.num_kv_heads || head_dim != c.shape_.head_dim) {
      Backend::rope_kv_write(cache, layer, qkv, ld, n, num_heads, num_kv_heads, head_dim, cos_sin, kind);
      return;
    }
    const bool neox = kind == RopeKind::Neox;
    uint16_t* kc = c.k + c.layer_elems * layer;
    uint16_t* vc = c.v + c.layer_elems * layer;
    const cuda::DeviceStep ds = dstep_;
    const int64_t nh = num_heads, nkv = num_kv_heads;
    run("rope_kv_write", __LINE__,
        {step_key(), P(qkv), U(ld), U(nh), U(nkv), U(head_dim), P(cos_sin), U(neox), P(kc), P(vc)},
        [=](cudaStream_t st) {
          return cuda::rope_kv_write(ds, qkv, ld, nh, nkv, head_dim, cos_sin, neox, kc, vc, st);
        });
  }
  void matmul_silu(const Weight& gate_up, const float* x, int64_t n, int64_t ffn, float* gu, float* out,
                   const Weight* next = nullptr) override {
    if (failed() || n <= 0) return;
    const auto& w = static_cast<const CudaWeight&>(gate_up);
    if (!fused_gemv(w.type, n) || w.rows != 2 * ffn) {
      Backend::matmul_silu(gate_up, x, n, ffn, gu, out, next);
      return;
    }
    const auto f = fused_weight(w, x, n);
    if (!f) return;
    // The int8 GEMV also quantizes its output for the down matmul's int8 GEMV (into the
    // second buffer: the first may hold this launch's own input).
    cuda::SiluQ8Args q;
    if (f->xq && (q.xq = q8_for(next, n, ffn, &q.nq, /*second=*/true))) {
      q.done = silu_counters(n, ffn);
      if (!q.done) return;
    }
    run("gemv_silu", __LINE__,
        {P(f->data), f->rb, U(ffn), U(f->cols), P(x), U(n), P(out), P(f->xq), U(f->ready), P(q.xq), Q(q.nq), P(q.done)},
        [=, f = *f](cudaStream_t st) {
          const cudaError_t e = f.quantize(x, n, st);
          return e != cudaSuccess ? e : cuda::gemv_silu(f.type, f.data, f.rb, ffn, f.cols, x, f.xq, n, out, ffn, st, q);
        });
    prepared(out, n, ffn, q.nq, q.xq);
  }
  void matmul_rope_kv_write(const Weight& wqkv, const float* x, KvCache& cache, int32_t layer, float* qkv, int64_t ld,
                            int64_t n, int32_t num_heads, int32_t num_kv_heads, int64_t head_dim, const float* cos_sin,
                            RopeKind kind) override {
    if (failed() || n <= 0) return;
    const auto& w = static_cast<const CudaWeight&>(wqkv);
    auto& c = static_cast<CudaKvCache&>(cache);
    const int64_t nh = num_heads, nkv = num_kv_heads;
    // One cache row per step token, the whole QKV weight, whole rotation pairs; anything
    // else takes the unfused ops.
    if (!fused_gemv(w.type, n) || n != dstep_.num_tokens || nkv != c.shape_.num_kv_heads ||
        head_dim != c.shape_.head_dim || head_dim % 2 != 0 || w.rows != (nh + 2 * nkv) * head_dim || ld < w.rows) {
      Backend::matmul_rope_kv_write(wqkv, x, cache, layer, qkv, ld, n, num_heads, num_kv_heads, head_dim, cos_sin,
                                    kind);
      return;
    }
    const auto f = fused_weight(w, x, n);
    if (!f) return;
    const bool neox = kind == RopeKind::Neox;
    uint16_t* kc = c.k + c.layer_elems * layer;
    uint16_t* vc = c.v + c.layer_elems * layer;
    const cuda::RopeKvArgs a{qkv, ld, nh, nkv, head_dim, cos_sin, neox, dstep_.slot_mapping, kc, vc};
    run("gemv_rope_kv_write", __LINE__,
        {step_key(), P(f->data), f->rb, U(f->cols), P(x), U(n), P(qkv), U(ld), U(nh), U(nkv), U(head_dim), P(cos_sin),
         U(neox), P(kc), P(vc), P(f->xq), U(f->ready)},
        [=, f = *f](cudaStream_t st) {
          const cudaError_t e = f.quantize(x, n, st);
          return e != cudaSuccess ? e : cuda::gemv_rope_kv_write(f.type, f.data, f.rb, f.cols, x, f.xq, n, a, st);
        });
  }
  void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) override {
    if (failed()) return;
    const int32_t* dev_rows = upload_indices(rows, n);
    if (!dev_rows) return;
    run("gather_rows", __LINE__, {P(x), U(dim), P(dev_rows), U(n), P(out)},
        [=](cudaStream_t st) { return cuda::gather_rows(x, dim, dev_rows, n, out, st); });
  }
  void moe_combine(const float* y, int64_t dim, const int32_t* src, const float* weights, int64_t n, int32_t k,
                   float* out) override {
    if (failed() || n <= 0 || k <= 0) return;
    const size_t nk = static_cast<size_t>(n) * static_cast<size_t>(k);
    moe_meta_.resize(2 * nk);
    std::memcpy(moe_meta_.data(), src, nk * sizeof(int32_t));
    std::memcpy(moe_meta_.data() + nk, weights, nk * sizeof(float));
    const int32_t* meta = upload_indices(moe_meta_.data(), static_cast<int64_t>(2 * nk));
    if (!meta) return;
    run("moe_combine", __LINE__, {P(y), U(dim), P(meta), U(n), U(k), P(out)},
        [=](cudaStream_t st) { return cuda::moe_combine(y, dim, meta, n, k, out, st); });
  }

 private:
  bool failed() const { return !error_.empty(); }
  // Which kernel matmul() runs for this weight type and token count.
  enum class MatmulPath { kTensorCores, kGemvQ8, kGemv, kCublas };
  MatmulPath matmul_path(DType type, int64_t n) const {
    if (tc_gemm_ && cuda::has_gemm_tc(type) && !simple_gemv_) return MatmulPath::kTensorCores;
    if (n > kGemvMaxTokens && !batch_invariant_) return MatmulPath::kCublas;
    return cuda::uses_q8_activations(type) && !simple_gemv_ ? MatmulPath::kGemvQ8 : MatmulPath::kGemv;
  }
  // Whether gemv_q8 runs its tensor-core kernel for n tokens (TROUPE_CUDA_Q8_MMA).
  bool q8_on_tensor_cores(int64_t n) const { return q8_mma_min_ > 0 && n >= q8_mma_min_; }
  // Whether matmul() would run the GEMV for this type and token count and a fused epilogue
  // exists for it (TROUPE_CUDA_FUSE=0: never, for benchmarks).
  // Not where gemv_q8 takes its tensor-core kernel: the unfused ops then (the same bits).
  bool fused_gemv(DType type, int64_t n) const {
    const MatmulPath path = matmul_path(type, n);
    if (path == MatmulPath::kGemvQ8 && q8_on_tensor_cores(n)) return false;
    return fuse_ && !simple_gemv_ && (path == MatmulPath::kGemv || path == MatmulPath::kGemvQ8) &&
           cuda::has_fused_gemv(type);
  }
  // What a fused call's launch takes of its weight, and for the int8 types the buffer of
  // its quantized activations (xq; null for f16/bf16) and whether the norm that wrote x has
  // filled it already (ready). Counts the call.
  struct FusedWeight {
    DType type;
    const void* data;
    size_t rb;
    int64_t cols;
    uint8_t* xq;
    bool ready;
    cudaError_t quantize(const float* x, int64_t n, cudaStream_t st) const {
      return xq && !ready ? cuda::quantize_q8(type, x, cols, cols, n, xq, st) : cudaSuccess;
    }
  };
  std::optional<FusedWeight> fused_weight(const CudaWeight& w, const float* x, int64_t n) {
    ++fused_calls_;
    FusedWeight f{w.type, w.data, w.row_bytes, w.cols, nullptr, false};
    if (cuda::uses_q8_activations(w.type)) {
      f.xq = acts_.take_q8(x, n, w.cols, op_seq_, cuda::q8_numerics(w.type));
      f.ready = f.xq != nullptr;
      if (!f.ready && !(f.xq = q8_scratch(n, w.cols))) return std::nullopt;
    }
    return f;
  }
  // The buffer an op with n rows of dim output values writes their int8 activations to for
  // `next` (null: `next` does not take the int8 GEMV, or none is named; *nq: their rounding).
  // second: the second buffer (for an op whose input is in the first).
  uint8_t* q8_for(const Weight* next, int64_t n, int64_t dim, cuda::Q8Numerics* nq, bool second = false) {
    if (!next || !fuse_ || failed() || n <= 0 || dim % 32 != 0) return nullptr;
    const auto& w = static_cast<const CudaWeight&>(*next);
    if (w.cols != dim || matmul_path(w.type, n) != MatmulPath::kGemvQ8) return nullptr;
    *nq = cuda::q8_numerics(w.type);
    return q8_scratch(n, dim, second);
  }
  // Where an op with n rows of dim output values writes them in half too for `next` when
  // that is a cuBLAS matmul (xh_, bf16 for a bf16 weight; p null: it is not, or none is named).
  cuda::HalfOut half_for(const Weight* next, int64_t n, int64_t dim) {
    if (!next || !fuse_ || failed() || n <= 0) return {};
    const auto& w = static_cast<const CudaWeight&>(*next);
    if (w.cols != dim || w.type == DType::F32 || matmul_path(w.type, n) != MatmulPath::kCublas ||
        !ensure(&xh_, &xh_cap_, static_cast<size_t>(n * dim) * 2))
      return {};
    return {xh_, w.type == DType::BF16};
  }
  // An op's output out was also written as xq or xh (prepared.h).
  void prepared(const float* out, int64_t n, int64_t dim, cuda::Q8Numerics nq, uint8_t* xq, cuda::HalfOut xh = {}) {
    if (!failed()) acts_.record(out, n, dim, op_seq_, xq, nq, xh);
  }
  // An int8 activations' buffer for n rows of cols values (nullptr on failure, recorded).
  uint8_t* q8_scratch(int64_t n, int64_t cols, bool second = false) {
    const size_t bytes = size_t(n) * cuda::q8_row_bytes(cols);
    void** buf = second ? &xq2_ : &xq_;
    return ensure(buf, second ? &xq2_cap_ : &xq_cap_, bytes) ? static_cast<uint8_t*>(*buf) : nullptr;
  }
  // The SiLU quantizer's block counters for n tokens of ffn values, zeroed when allocated
  // (each launch leaves them zero).
  unsigned* silu_counters(int64_t n, int64_t ffn) {
    const size_t bytes = static_cast<size_t>(cuda::silu_q8_counters(n, ffn)) * sizeof(unsigned);
    const bool grow = bytes > done_cap_;
    if (!ensure(&done_, &done_cap_, bytes)) return nullptr;
    // (in the stream's order: a synchronous cudaMemset goes through the legacy stream, which
    // the backend's non-blocking stream does not wait for)
    if (grow &&
        !check(cudaMemsetAsync(done_, 0, done_cap_, stream_), "cudaMemsetAsync(SiLU counters)", __FILE__, __LINE__))
      return nullptr;
    return static_cast<unsigned*>(done_);
  }
  bool check(cudaError_t e, const char* what, const char* file, int line) {
    if (e == cudaSuccess) return true;
    if (error_.empty())
      error_ = std::string(what) + " failed: " + cudaGetErrorString(e) + " (" + file + ":" + std::to_string(line) + ")";
    return false;
  }
  bool check_blas(cublasStatus_t s, const char* what, const char* file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    if (error_.empty())
      error_ =
          std::string(what) + " failed: " + cublasGetStatusString(s) + " (" + file + ":" + std::to_string(line) + ")";
    return false;
  }
  static uint64_t P(const void* p) { return reinterpret_cast<uintptr_t>(p); }
  static uint64_t U(int64_t v) { return static_cast<uint64_t>(v); }
  static uint64_t Q(cuda::Q8Numerics nq) { return U(nq.d_as_f16) | U(nq.s_as_f16) << 1; }
  static uint64_t F(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  }
  // What a launch takes from the device step besides device data, for launch signatures:
  // the shape and buffer, and the attention segment count (it sets the grid). The context
  // length itself is read from device memory (positions), so decode steps of one shape
  // share a signature while their contexts grow.
  // (Each field goes through a 64-bit mix, not shifted into overlapping bits: 128 segments
  // of a 2-sequence step and none of a 3-sequence one must not share a key.)
  uint64_t step_key() const {
    uint64_t h = 0;
    for (uint64_t v : {U(dstep_.num_tokens), U(dstep_.num_seqs), U(dstep_.max_blocks_per_seq),
                       U(cuda::attention_segments(dstep_.max_context)), P(dstep_.token_ids)}) {
      h = (h ^ v) + 0x9e3779b97f4a7c15ull;  // splitmix64's step and finaliser
      h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
      h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
      h ^= h >> 31;
    }
    return h;
  }
  // Runs a launch now, or records it for the step's graph.
  template <typename Fn>
  void run(const char* what, int line, std::initializer_list<uint64_t> key, Fn&& fn) {
    ++op_seq_;
    if (failed()) return;
    if (graphs_.recording()) {
      graphs_.add(what, key, std::forward<Fn>(fn));
      return;
    }
    clear_stale_error();
    check(fn(stream_), what, __FILE__, line);
  }
  // A failed CUDA call also sets the thread's last error, which the next launch's
  // cudaGetLastError would report as its own: failures are reported (or tolerated) where
  // they happen, so every eager launch -- run(), flush(), and what follows a flush --
  // starts from a cleared one. (A sticky error, a fault in a kernel, stays: it is real.)
  static void clear_stale_error() { cudaGetLastError(); }
  // Runs what is recorded (a graph replay, a capture, or eager launches).
  void flush() {
    ++op_seq_;  // (callers go on to eager work: cuBLAS, copies, sampling)
    clear_stale_error();
    if (!graphs_.has_pending()) return;
    std::string what;
    const cudaError_t e = graphs_.flush(stream_, &what);
    if (e != cudaSuccess) check(e, what.c_str(), __FILE__, __LINE__);
  }
  // Copies host bytes into the pinned staging arena; null when they do not fit.
  void* stage(const void* src, size_t bytes) {
    if (!arena_) {
      if (cudaMallocHost(&arena_, kArenaBytes) != cudaSuccess) {  // (tolerated)
        arena_ = nullptr;
        return nullptr;
      }
    }
    const size_t off = (arena_off_ + 255) / 256 * 256;
    if (off + bytes > kArenaBytes) return nullptr;
    void* p = static_cast<uint8_t*>(arena_) + off;
    std::memcpy(p, src, bytes);
    arena_off_ = off + bytes;
    return p;
  }
  // Grows a device scratch buffer (running what is recorded and waiting for its users
  // first; graphs that refer to the old buffer are dropped), by half at least where it can,
  // so a growing batch or context drops the graphs only now and then. A failed allocation
  // fails the backend, unless `optional`: then it returns false (the caller has another way).
  bool ensure(void** buf, size_t* cap, size_t bytes, bool optional = false) {
    if (bytes <= *cap) return true;
    flush();
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", __FILE__, __LINE__);
    graphs_.clear();
    const size_t grown = *cap + *cap / 2;
    if (*buf) cudaFree(*buf);
    *buf = nullptr;
    *cap = 0;
    if (grown > bytes && cudaMalloc(buf, grown) == cudaSuccess) {
      *cap = grown;
      return true;
    }
    *buf = nullptr;
    cudaGetLastError();  // (the larger size was only a wish: its failure is not an error)
    const cudaError_t e = cudaMalloc(buf, bytes);
    if (e != cudaSuccess) {
      *buf = nullptr;
      if (!optional) check(e, "cudaMalloc(scratch)", __FILE__, __LINE__);
      return false;
    }
    *cap = bytes;
    return true;
  }
  const int32_t* upload_indices(const int32_t* host, int64_t n) {
    ++op_seq_;
    if (n <= 0) return nullptr;
    if (!ensure(&idx_dev_, &idx_cap_, static_cast<size_t>(n) * 4)) return nullptr;
    void* dev = idx_dev_;
    const size_t bytes = static_cast<size_t>(n) * 4;
    if (graphs_.recording()) {
      if (void* staged = stage(host, bytes)) {
        run("index upload", __LINE__, {P(dev), P(staged), bytes},
            [=](cudaStream_t st) { return cudaMemcpyAsync(dev, staged, bytes, cudaMemcpyHostToDevice, st); });
        return static_cast<const int32_t*>(dev);
      }
      flush();
    }
    // From pageable memory: the call returns once the source has been staged, in stream order.
    if (!TROUPE_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_))) return nullptr;
    return static_cast<const int32_t*>(dev);
  }

  std::vector<int32_t> moe_meta_;  // moe_combine's rows and weights, uploaded as one index list
  int device_;
  bool batch_invariant_;
  bool tc_gemm_;  // batch-invariant f16/bf16 matmuls on tensor cores
  // The TROUPE_CUDA_* variables (CudaEnvOptions, docs/flags.md):
  bool simple_gemv_;  // =simple: the plain f32-activation GEMV for every type (benchmarks)
  // =direct: attention reads K rows straight from global memory rather than staging them
  // in shared memory (the same bits; benchmarks compare the two).
  bool direct_k_;
  // =0: the gate/up and QKV GEMVs without their fused SiLU and RoPE + KV write epilogues
  // (the same bits; benchmarks compare the two).
  bool fuse_;
  // =N: the int8 matmuls of N or more tokens on tensor cores (matmul_q8.cu,
  // gemm_q8_mma_kernel: the GEMV's bits, weights read once per 64 tokens instead of per 8);
  // unset or 0: the GEMV at every size. Opt-in until a GPU has measured it.
  int64_t q8_mma_min_;
  // =tc (batch-invariant mode): every token's attention on tensor cores
  // (attention_mma_invariant: other bits than attention(), P rounded to f16). Opt-in until
  // a GPU has measured it. =wmma: the same, and --cuda-cublas's prefill tiles, on the WMMA
  // kernels (attention_tc.cu) instead of the mma.sync ones (attention_mma.cu).
  bool tc_attention_;
  bool wmma_attention_;
  uint64_t q8_mma_calls_ = 0;  // matmul() calls that took it
  uint64_t tc_attention_calls_ = 0,
           mma_attention_calls_ = 0;  // attention() calls: every token on tensor cores; attention_mma
  uint64_t fused_calls_ = 0;          // matmul_silu / matmul_rope_kv_write calls that took the fused kernels
  cuda::PreparedActivations acts_;
  uint64_t op_seq_ = 0;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  std::string name_, error_;
  std::vector<void*> buffers_;
  StepInputs step_{};
  cuda::DeviceStep dstep_{};
  int32_t* step_host_ = nullptr;  // pinned
  int32_t* step_dev_ = nullptr;
  size_t step_cap_ = 0;  // int32 elements
  void *idx_dev_ = nullptr, *wh_ = nullptr, *xh_ = nullptr, *partials_ = nullptr, *xq_ = nullptr, *xq2_ = nullptr,
       *done_ = nullptr, *sample_dev_ = nullptr;
  size_t idx_cap_ = 0, wh_cap_ = 0, xh_cap_ = 0, partials_cap_ = 0, xq_cap_ = 0, xq2_cap_ = 0, done_cap_ = 0,
         sample_dev_cap_ = 0;    // bytes
  void* sample_host_ = nullptr;  // pinned: sampling parameters in, tokens and logprobs out
  size_t sample_host_cap_ = 0;
  int num_sms_ = 132;
  int max_shared_optin_ = 0;           // bytes of shared memory a block may opt into
  size_t partials_denied_ = SIZE_MAX;  // split-KV partials of this many bytes could not be allocated
  size_t max_weight_elems_ = 0;
  int32_t graph_max_tokens_ = 0;
  cuda::StepGraphs graphs_;
  static constexpr size_t kArenaBytes = size_t{16} << 20;
  void* arena_ = nullptr;  // pinned staging for host data recorded into graphs
  size_t arena_off_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts) {
  if (std::string why = cuda_unavailable_reason(); !why.empty()) return make_error("--device cuda: " + why);
  int count = 0;
  cudaGetDeviceCount(&count);
  if (opts.device < 0 || opts.device >= count)
    return make_error("--device cuda:" + std::to_string(opts.device) + ": only " + std::to_string(count) +
                      " CUDA device(s) present");
  if (cudaError_t e = cudaSetDevice(opts.device); e != cudaSuccess)
    return make_error(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, opts.device); e != cudaSuccess)
    return make_error(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e));
  auto env = cuda_env_options();
  if (!env.ok()) return make_error("--device cuda: " + env.error().message);
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
    return make_error(std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
  cublasHandle_t blas = nullptr;
  if (cublasStatus_t s = cublasCreate(&blas); s != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return make_error(std::string("cublasCreate: ") + cublasGetStatusString(s));
  }
  cublasSetStream(blas, stream);
  const std::string name = "cuda:" + std::to_string(opts.device) + "(" + prop.name + ", sm_" +
                           std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
                           std::to_string(prop.totalGlobalMem >> 30) + " GiB, " +
                           (!opts.batch_invariant ? "cuBLAS above 8 tokens"
                            : opts.tc_gemm        ? "batch-invariant, tensor-core matmul for f16/bf16"
                                                  : "batch-invariant GEMV") +
                           ")";
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(opts, *env, stream, blas, name));
}

}  // namespace troupe
