// The backend interface: every op the forward pass needs, over plain pointers and
// lengths. The CPU backend (kernels/cpu/) is the reference; the CUDA backend implements
// the same interface. Step metadata (StepInputs) is planned once per step on the host and
// used by every layer; a device backend uploads it once in begin_step().
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/result.h"
#include "kernels/sample_params.h"

namespace troupe {

enum class RopeKind : uint8_t { Interleaved, Neox };

// A weight matrix [rows, cols] (y = W x) in the backend's own layout.
class Weight {
 public:
  virtual ~Weight() = default;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
};

struct KvCacheShape {
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual const KvCacheShape& shape() const = 0;
};

// A packed batch: many sequences of different lengths in one call.
struct StepInputs {
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* query_start = nullptr;   // [num_seqs + 1] token offsets per sequence
  const int32_t* context_lens = nullptr;  // [num_seqs] KV length once this step is written
  const int32_t* slot_mapping = nullptr;  // [num_tokens] block * block_size + offset
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
};

// One matmul of a group (Backend::matmul_group): y rows at stride ldy.
struct MatmulJob {
  const Weight* w = nullptr;
  const float* x = nullptr;
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Prepares one weight from host data in GGUF layout; several parts (same type and cols)
  // are concatenated by rows (fused QKV, gate/up). `src` may need to outlive the weight.
  virtual Result<std::unique_ptr<Weight>> make_weight(DType type, int64_t cols,
                                                      const std::vector<std::pair<const void*, int64_t>>& parts) = 0;
  virtual Result<std::unique_ptr<KvCache>> make_kv_cache(const KvCacheShape& shape) = 0;
  virtual float* alloc(size_t num_floats) = 0;  // activation scratch owned by the backend

  // Memory. A device backend's alloc() returns device memory that the host cannot read;
  // the model moves data with these. Index arrays passed to ops (token ids, rows) and the
  // StepInputs arrays are always host memory: a device backend copies them itself.
  virtual bool is_host_memory() const { return true; }
  // dst (backend memory, n floats) <- src (host)
  virtual void copy_in(float* dst, const float* src, size_t n);
  // dst (host) <- src (backend memory, n floats); waits for the work queued before it.
  virtual void copy_out(float* dst, const float* src, size_t n);
  // A backend-owned copy of a host vector (norm weights, biases).
  float* upload(const std::vector<float>& v);
  // Waits for queued work and reports the first failed CUDA call or launch since the
  // backend was made (call, file and line; a device error is sticky). Model::forward ends
  // every step with it; the CPU backend cannot fail here.
  virtual Status sync() { return {}; }
  // The caller is about to wait a while for someone else (an expert worker's answer, the
  // next dispatch): helper threads stop spinning for work and sleep until the next call, so
  // that on a shared machine they leave the cores to whoever computes meanwhile.
  virtual void idle() {}
  // Sampling on the backend, so that only token ids leave the device. A backend that can
  // (can_sample) samples rows [n, vocab] of backend memory (logits, row stride vocab) with
  // one DeviceSampleParams each, exactly as Sampler::sample() would for a request without
  // penalties, logit bias or top-logprob lists (the same candidates, order and Philox
  // draw; a token can differ only where a draw falls within rounding of a boundary).
  // tokens/logprobs are host arrays [n], written before sample() returns. Others refuse.
  virtual bool can_sample() const { return false; }
  virtual Status sample(const float* logits, int64_t n, int64_t vocab, const DeviceSampleParams* params,
                        int32_t* tokens, float* logprobs);
  // One line of backend counters for logs and tests ("" when there are none).
  virtual std::string stats() const { return {}; }

  virtual void begin_step(const StepInputs& step) = 0;
  // out[i] = table[ids[i]]  (dequantized)                        out: [n, table.cols]
  virtual void embed(const Weight& table, const int32_t* ids, int64_t n, float* out) = 0;
  // `next`: the weight of the matmul expected to read `out` as the very next op, or null. A
  // backend may prepare that matmul's input on the way out (CUDA: the int8 activations of
  // the quantized GEMV, in the norm's own launch); it must check that the next op is that
  // matmul on `out` before using what it prepared, so a wrong hint costs nothing but time.
  virtual void rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out,
                        const Weight* next = nullptr) = 0;
  // y[t, :] = W x[t, :] (+ bias)  x: [n, cols] contiguous, y rows at stride ldy
  virtual void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) = 0;
  // Independent matmuls at once (a MoE layer's experts over their few rows each), with the
  // bits matmul() gives each: a backend that groups_matmuls() runs them in one pass over its
  // threads instead of one pass (and its launch cost) each; the default runs them in turn.
  virtual bool groups_matmuls() const { return false; }
  virtual void matmul_group(const MatmulJob* jobs, int64_t count) {
    for (int64_t j = 0; j < count; ++j) matmul(*jobs[j].w, jobs[j].x, jobs[j].n, jobs[j].y, jobs[j].ldy);
  }
  virtual void add_bias(float* y, int64_t ld, const float* bias, int64_t n, int64_t dim) = 0;
  // In place: each of the `groups` spans of `dim` values at x[t * ld + g * dim] (t < n) is
  // RMS-normalised and scaled by w [dim] (Q/K norms). The default copies through the host.
  virtual void rms_norm_strided(float* x, int64_t ld, int64_t n, int64_t groups, int64_t dim, const float* w,
                                float eps);
  // Rotates heads in place. cos_sin: [n, head_dim] as (cos, sin) pairs per frequency.
  virtual void rope(float* x, int64_t ld, int64_t n, int64_t num_heads, int64_t head_dim, const float* cos_sin,
                    RopeKind kind) = 0;
  // Writes k and v rows (stride ld) into the cache slots of the current step.
  virtual void kv_write(KvCache& cache, int32_t layer, const float* k, const float* v, int64_t ld) = 0;
  // Causal attention of the step's queries over the paged cache.
  // q: [n, num_heads * head_dim] at stride ld_q; out: [n, num_heads * head_dim] contiguous.
  // next: the matmul that reads out next, if known (a hint, as for rms_norm: a backend may
  // prepare its input on the way out; the result is the same).
  virtual void attention(KvCache& cache, int32_t layer, const float* q, int64_t ld_q, int32_t num_heads, float scale,
                         float* out, const Weight* next = nullptr) = 0;
  // out[r, j] = silu(gate_up[r, j]) * gate_up[r, ffn + j]  gate_up: [n, 2 ffn], out: [n, ffn].
  // next: the matmul that reads out next, if known (a hint, as for rms_norm).
  virtual void silu_mul(const float* gate_up, int64_t n, int64_t ffn, float* out, const Weight* next = nullptr) = 0;
  virtual void add(float* x, const float* y, int64_t count) = 0;

  // Fused ops. Each default is the composition of the ops above, so a backend that does
  // not override one gets the same bits; a backend that does must give the same bits too
  // (the CUDA kernels do, by the same per-thread arithmetic).
  // The residual add fused into the next norm: x += y ([n, dim]), then out = rms_norm(x) * w.
  // out may be y (the matmul output that was just added). `next`: as rms_norm()'s.
  virtual void add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                            const Weight* next = nullptr);
  // RoPE on the Q and K heads of fused QKV rows (q | k | v, row stride ld) and the KV-cache
  // write of the rotated K and of V: rope(q), rope(k) and kv_write in one pass.
  virtual void rope_kv_write(KvCache& cache, int32_t layer, float* qkv, int64_t ld, int64_t n, int32_t num_heads,
                             int32_t num_kv_heads, int64_t head_dim, const float* cos_sin, RopeKind kind);
  // The fused gate/up matmul (gate rows, then up rows: 2 ffn rows) with the SiLU-gated
  // multiply: out = silu(gate) * up ([n, ffn]). gu: [n, 2 ffn] scratch the default fills.
  // next: the weight that reads out next (a hint, as rms_norm's).
  virtual void matmul_silu(const Weight& gate_up, const float* x, int64_t n, int64_t ffn, float* gu, float* out,
                           const Weight* next = nullptr);
  // The fused QKV matmul (qkv rows at stride ld) with rope_kv_write() after it.
  virtual void matmul_rope_kv_write(const Weight& wqkv, const float* x, KvCache& cache, int32_t layer, float* qkv,
                                    int64_t ld, int64_t n, int32_t num_heads, int32_t num_kv_heads, int64_t head_dim,
                                    const float* cos_sin, RopeKind kind);
  // out[i, :] = x[rows[i], :]
  virtual void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) = 0;
  // The mixture-of-experts combine: out[t, :] = sum over j < k, in order, of
  // weights[t k + j] * y[src[t k + j], :] (the first term is a product, the rest added), so a
  // token's bits do not depend on the batch. src and weights are host arrays [n k]. The default
  // runs on the host (copying through it on a device backend).
  virtual void moe_combine(const float* y, int64_t dim, const int32_t* src, const float* weights, int64_t n, int32_t k,
                           float* out);
};

// The host loop behind Backend::rms_norm_strided (w on the host).
void rms_norm_strided_host(float* x, int64_t ld, int64_t n, int64_t groups, int64_t dim, const float* w, float eps);

// The host loop behind Backend::moe_combine (the CPU backend's and the reference's).
void moe_combine_host(const float* y, int64_t dim, const int32_t* src, const float* weights, int64_t n, int32_t k,
                      float* out);

struct CpuBackendOptions {
  int num_threads = 0;  // 0: all cores
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opts);

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal
  // true: every matmul runs the fused dequant-GEMV (token groups of 8), so a token's result
  // never depends on its batch neighbours, as on the CPU. false: batches above 8 tokens go
  // through cuBLAS (dequantized to f16), faster for long prefills but batch-dependent.
  bool batch_invariant = true;
  // Steps of at most this many tokens (decode) are recorded and replayed as CUDA graphs,
  // one per step shape (captured on a shape's second step); 0 turns graphs off. Replay
  // gives the eager launches' bits (checked on the host-run fake; the [cuda] test that
  // checks it on a GPU has not run since the signature fix, docs/gpu.md), and a sequence
  // that cannot be captured runs eagerly.
  int graph_max_tokens = 64;
  // With batch_invariant: f16/bf16 weights go through the tensor-core matmul (matmul_tc.cu)
  // at every batch size instead of the GEMV -- also batch-invariant, with x rounded to the
  // weight's type (other bits than the GEMV's). Opt-in until measured on a GPU (docs/gpu.md).
  bool tc_gemm = false;
};
// The CUDA backend's environment variables (docs/flags.md), read when a backend is made.
// Each takes only the values listed there; any other value is an error naming the
// variable, its value and what it takes (not silently the default).
struct CudaEnvOptions {
  bool simple_gemv = false;   // TROUPE_CUDA_GEMV=simple: the f32-activation GEMV for every type
  bool direct_k = false;      // TROUPE_CUDA_ATTN=direct (or staged): K rows read from global memory
  bool tc_attention = false;  // TROUPE_CUDA_ATTN=tc or wmma: every token's attention on tensor cores (batch-invariant)
  bool wmma_attention = false;  // TROUPE_CUDA_ATTN=wmma: tensor-core attention on WMMA kernels, not mma.sync
  bool fuse = true;             // TROUPE_CUDA_FUSE=0|1: fused GEMV epilogues, quantization, half inputs for cuBLAS
  int64_t q8_mma_min = 0;       // TROUPE_CUDA_Q8_MMA=N: int8 matmuls of N+ tokens on tensor cores (0: never)
};
Result<CudaEnvOptions> cuda_env_options();
// TROUPE_CPU_ISA (scalar, avx2 or avx512, the last no cap): an error for any other value.
Status check_cpu_isa_env();

// kernels/cuda/: an error (never a crash) when the build has no CUDA, no GPU is present,
// the device ordinal is out of range or a TROUPE_CUDA_* variable has a value it does not take.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts);
// Why the CUDA backend cannot run here, or empty when it can (built with CUDA, a GPU present).
std::string cuda_unavailable_reason();
// Tests only (tests/hostrun/README.md): the factory make_backend() uses for "cuda" devices
// instead of make_cuda_backend, so that the actor runtime runs on the host-run CUDA backend
// on machines without a GPU; nullptr restores make_cuda_backend.
using CudaBackendFactory = Result<std::unique_ptr<Backend>> (*)(const CudaBackendOptions&);
void set_cuda_backend_factory_for_tests(CudaBackendFactory factory);

// "cpu" or "cuda" / "cuda:N": the backend a --device flag names.
// cuda: the CUDA backend's options (ignored for the CPU); its device is the one named.
// A list of GPUs ("cuda:0,1") is refused here: see stage_devices().
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int cpu_threads,
                                              const CudaBackendOptions& cuda = {});
// The --device of each of num_stages pipeline stages: every stage gets `device` itself, but
// for a list of GPUs "cuda:A,B,..." the stages are cut into as many contiguous groups as
// the list names, in order (4 stages over cuda:0,1: stages 0-1 on GPU 0, 2-3 on GPU 1);
// the list may not name more GPUs than there are stages. Entries are checked when each
// stage's backend is made (make_backend).
Result<std::vector<std::string>> stage_devices(const std::string& device, int32_t num_stages);

}  // namespace troupe
