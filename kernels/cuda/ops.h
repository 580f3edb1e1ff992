// Host-side launchers of the CUDA ops (one .cu file each). Plain C++: cuda_backend.cpp and
// the tests include this without nvcc. Every launcher enqueues on `stream` and returns the
// launch's cudaError_t (cudaGetLastError), which the backend checks with the call's name.
// Pointers are device memory unless named *_host.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/dtype.h"
#include "kernels/sample_params.h"

namespace troupe::cuda {

// The step's metadata on the device (uploaded once per step by begin_step).
struct DeviceStep {
  int32_t num_tokens = 0, num_seqs = 0, max_blocks_per_seq = 0, max_context = 0;
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens]
  const int32_t* token_seq = nullptr;     // [num_tokens] sequence of each token
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  // [num_tokens + 1] the step's tokens in tiles of up to 16 of one sequence: tile i is
  // tokens tiles[i] .. tiles[i + 1] - 1; past the last tile every entry is num_tokens.
  const int32_t* tiles = nullptr;
};

// True when `type` has device kernels (embedding, GEMV, dequantization).
bool is_supported_type(DType type);

// out[i, :] = dequant(table row ids[i])                         out: [n, cols]
cudaError_t embed(DType type, const void* table, size_t row_bytes, int64_t cols, const int32_t* ids, int64_t n,
                  float* out, cudaStream_t stream);
// How the int8 activations are rounded for a weight type (matmul_q8.cu): d as f16 for the
// 32-value block types (f32 for the K-quants), s = d * sum(q) as f16 for Q4_1 and Q5_1.
struct Q8Numerics {
  bool d_as_f16 = true, s_as_f16 = false;
  bool operator==(const Q8Numerics&) const = default;
};
inline Q8Numerics q8_numerics(DType weight_type) {
  const bool k_quant = weight_type == DType::Q4_K || weight_type == DType::Q5_K || weight_type == DType::Q6_K;
  return {!k_quant, weight_type == DType::Q4_1 || weight_type == DType::Q5_1};
}
// A half copy (f16, or bf16) of an op's n x dim output, for the cuBLAS matmul that reads
// it next (--cuda-cublas prefill): value j of row r at p[r * dim + j], rounded as
// to_half_rows() rounds (the same bits), so that matmul converts nothing. p null: none.
struct HalfOut {
  void* p = nullptr;
  bool bf16 = true;
};
// The norms can also quantize their output as quantize_q8() would (the same bytes), for the
// int8 GEMV that reads it next: xq non-null (n rows of q8_row_bytes(dim)) needs dim % 32 == 0;
// or write it in half for cuBLAS (xh).
cudaError_t rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out, cudaStream_t stream,
                     uint8_t* xq = nullptr, Q8Numerics nq = {}, HalfOut xh = {});
// x += y, then out = rms_norm(x) * w; the same bits as add() then rms_norm(). out may be y.
cudaError_t add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                         cudaStream_t stream, uint8_t* xq = nullptr, Q8Numerics nq = {}, HalfOut xh = {});
// y[t, r] = sum_k W[r, k] x[t, k]; W rows of row_bytes in GGUF layout. Fused dequant-GEMV in
// groups of up to 8 tokens; each token's result is independent of n (batch-invariant).
//                                                               x: [n, ldx], y: [n, ldy]
// simple: the plain kernel even where a prefetching one exists (same bits; for benchmarks).
cudaError_t gemv(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const float* x, int64_t ldx,
                 int64_t n, float* y, int64_t ldy, cudaStream_t stream, bool simple = false);
// The same product on tensor cores for F16/BF16 weights (matmul_tc.cu): x rounded to the
// weight's type, f32 accumulation in a fixed order per element, so a token's result never
// depends on n (batch-invariant; not the bits of gemv()). row_bytes: a multiple of 64 (the
// backend pads float rows to 32 columns, with zeros). scratch: gemm_tc_scratch_bytes().
bool has_gemm_tc(DType type);
size_t gemm_tc_scratch_bytes(size_t row_bytes, int64_t n);
cudaError_t gemm_tc(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const float* x,
                    int64_t ldx, int64_t n, void* scratch, float* y, int64_t ldy, cudaStream_t stream);
// Activations quantized per 32 values for the quantized weight types (matmul_q8.cu). A
// token's row of nb = cols / 32 blocks holds the blocks' first 16 int8 values (nb x 16
// bytes), their last 16 (nb x 16), their scales d (nb floats; f16-rounded for the
// 32-block types), then s = d * sum(q) (nb floats): split so that a GEMV warp's lanes, a
// block each, read each part as one contiguous run. q8_row_bytes(cols): a token row's
// bytes, a multiple of 16 (rows stay 16-byte aligned).
__host__ __device__ inline size_t q8_row_bytes(int64_t cols) {
  return (static_cast<size_t>(cols / 32) * 40 + 15) / 16 * 16;
}
bool uses_q8_activations(DType type);  // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K
// x [n, ldx] (cols a multiple of 32) -> out: n rows of q8_row_bytes(cols); numerics depend
// on the weight type.
cudaError_t quantize_q8(DType weight_type, const float* x, int64_t ldx, int64_t cols, int64_t n, uint8_t* out,
                        cudaStream_t stream);
// y[t, r] = sum over blocks of (d_w d_x) isum + m_w s_x                 y: [n, ldy]
// From mma_min_tokens tokens on (0: never) the tensor-core kernel (mma.sync, sm_80+) runs
// instead of the GEMV: the same bits for every token, weights read once per 64 tokens.
cudaError_t gemv_q8(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const uint8_t* xq,
                    int64_t n, float* y, int64_t ldy, cudaStream_t stream, int64_t mma_min_tokens = 0);
// The GEMVs with the next op in their epilogue (gemv_epilogue.cuh), for f16/bf16 weights
// (x: f32 [n, cols]) and the int8-activation types (xq from quantize_q8()). Each output is
// the fused pair's bits: the same per-row sums as gemv() / gemv_q8(), then what silu_mul()
// or rope_kv_write() does with them. One launch instead of two, and (SiLU) no gate/up rows
// written and read back.
bool has_fused_gemv(DType type);  // F16, BF16 and uses_q8_activations()
// out[t, j] = silu(W_j . x_t) * (W_{ffn+j} . x_t): W is the fused gate|up weight (2 ffn rows).
// Where the int8 GEMV's SiLU epilogue also writes its output's int8 activations for the
// down matmul (the bytes quantize_q8() would write from out; ffn % 32 == 0): xq, n rows of
// q8_row_bytes(ffn) (must not be the GEMV's own input); done, silu_q8_counters(n, ffn)
// counters, zero before the first launch (each launch leaves them zero again).
struct SiluQ8Args {
  uint8_t* xq = nullptr;
  Q8Numerics nq;
  unsigned* done = nullptr;
};
inline int64_t silu_q8_counters(int64_t n, int64_t ffn) { return n * (ffn / 32); }
cudaError_t gemv_silu(DType type, const void* w, size_t row_bytes, int64_t ffn, int64_t cols, const float* x,
                      const uint8_t* xq, int64_t n, float* out, int64_t ldo, cudaStream_t stream,
                      const SiluQ8Args& q = {});
// rope_kv_write()'s arguments (qkv: the GEMV's output rows [n, ld], q | k | v).
struct RopeKvArgs {
  float* qkv = nullptr;
  int64_t ld = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* cos_sin = nullptr;
  bool neox = false;
  const int32_t* slots = nullptr;  // [n] cache slot of each token
  uint16_t* k_cache = nullptr;
  uint16_t* v_cache = nullptr;
};
// qkv = W x (W: the fused QKV weight, (num_heads + 2 num_kv_heads) head_dim rows), then
// rope_kv_write() on it: the rotated Q and K in qkv, K and V in the cache.
cudaError_t gemv_rope_kv_write(DType type, const void* w, size_t row_bytes, int64_t cols, const float* x,
                               const uint8_t* xq, int64_t n, const RopeKvArgs& args, cudaStream_t stream);
// Their int8-activation halves (matmul_q8.cu), which the two above call for those types.
cudaError_t gemv_q8_silu(DType type, const void* w, size_t row_bytes, int64_t ffn, int64_t cols, const uint8_t* xq,
                         int64_t n, float* out, int64_t ldo, cudaStream_t stream, const SiluQ8Args& q = {});
cudaError_t gemv_q8_rope_kv_write(DType type, const void* w, size_t row_bytes, int64_t cols, const uint8_t* xq,
                                  int64_t n, const RopeKvArgs& args, cudaStream_t stream);
// W -> f16 [rows, cols] for the cuBLAS path (prefill).
cudaError_t dequant_to_f16(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, void* out,
                           cudaStream_t stream);
// x [n, ldx] (first cols values a row) -> f16 (to_bf16 = false) or bf16 out [n_pad, ld_out],
// zero past cols and n.
cudaError_t to_half_rows(const float* x, int64_t ldx, int64_t n, int64_t cols, int64_t ld_out, int64_t n_pad, void* out,
                         bool to_bf16, cudaStream_t stream);
cudaError_t add_bias(float* y, int64_t ld, const float* bias, int64_t n, int64_t dim, cudaStream_t stream);
// In-place rotation; cos_sin: [n, head_dim] (cos, sin) pairs; neox: pairs (i, i + hd/2).
cudaError_t rope(float* x, int64_t ld, int64_t n, int64_t num_heads, int64_t head_dim, const float* cos_sin, bool neox,
                 cudaStream_t stream);
// rope() on the Q and K heads of fused QKV rows [n, ld] (q | k | v) and kv_write() of the
// rotated K and of V into one layer's cache, in one launch with the same bits.
cudaError_t rope_kv_write(const DeviceStep& step, float* qkv, int64_t ld, int64_t num_heads, int64_t num_kv_heads,
                          int64_t head_dim, const float* cos_sin, bool neox, uint16_t* k_cache, uint16_t* v_cache,
                          cudaStream_t stream);
// k/v rows at stride ld -> f16 cache rows [slot, row_elems] of one layer.
cudaError_t kv_write(const DeviceStep& step, const float* k, const float* v, int64_t ld, int64_t row_elems,
                     uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream);
// Causal paged attention over one layer's f16 cache. q: [n, num_heads * hd] at stride ld_q;
// out: [n, num_heads * hd]. head_dim must be a multiple of 32, at most 256. With `partials`
// (floats: n * num_heads * attention_segments(max_context) * (head_dim + 2)) each KV segment
// gets its own block (split-KV, for small batches); without, one block per token and group of
// up to four query heads of a KV head (attention_loop_blocks()).
// Both give the same bits.
// skip_tc_tiles (looped path only): leave the tokens of the tiles attention_tc/_mma take.
// direct_k: read K rows from global memory even where they would be staged in shared
// memory (head sizes up to 128); the same bits. xq (not with skip_tc_tiles): also writes
// out quantized for the int8 GEMV (n rows of q8_row_bytes(num_heads * head_dim)), the
// bytes quantize_q8() would write from it; xh: in half for cuBLAS (its tokens only).
cudaError_t attention(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                      int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                      const uint16_t* v_cache, float* out, float* partials, cudaStream_t stream,
                      bool skip_tc_tiles = false, bool direct_k = false, uint8_t* xq = nullptr, Q8Numerics nq = {},
                      HalfOut xh = {});
// Prefill attention on tensor cores (WMMA; not batch-invariant): tiles of 16 step tokens of
// one sequence, a block of four warps per tile and group of up to four query heads of one
// KV head, over the same cache and with the same output layout as attention(). Tokens in
// other tiles are not written: run attention() with skip_tc_tiles for them. Its dynamic
// shared memory per block is attention_tc_shared_bytes(head_dim) (0: unsupported width);
// the device must allow that much (cudaDevAttrMaxSharedMemoryPerBlockOptin). xh: as
// attention()'s, for its tiles' tokens.
cudaError_t attention_tc(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                         int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                         const uint16_t* v_cache, float* out, cudaStream_t stream, HalfOut xh = {});
// attention_tc's tiles and grouping, flash-attention-2 style (attention_mma.cu: mma.sync,
// S, P and O in registers, K/V tiles double-buffered by cp.async); not batch-invariant.
// head_dim: 32, 64, 96 or 128; its dynamic shared memory per block is
// attention_mma_shared_bytes(head_dim, false) (0: unsupported width), the device must allow
// that much (cudaDevAttrMaxSharedMemoryPerBlockOptin). xh: its tokens' output in half too.
cudaError_t attention_mma(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                          int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                          const uint16_t* v_cache, float* out, cudaStream_t stream, HalfOut xh = {});
// attention_tc_invariant's contract (below) with attention_mma's kernel (TROUPE_CUDA_ATTN=tc):
// every token on tensor cores, batch-invariant, keys in attention()'s segments merged in
// order, split-KV with `partials` (the same bits). Other bits than attention_tc_invariant.
// Its shared memory per block: at most attention_mma_shared_bytes(head_dim, true).
cudaError_t attention_mma_invariant(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads,
                                    int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale,
                                    const uint16_t* k_cache, const uint16_t* v_cache, float* out, float* partials,
                                    cudaStream_t stream);
size_t attention_mma_shared_bytes(int32_t head_dim, bool invariant);
// Every token's attention on tensor cores, batch-invariant (TROUPE_CUDA_ATTN=tc): a block
// of four warps per tile of step.tiles (up to 16 tokens of one sequence) and group of up to
// four query heads of one KV head, attention_tc's arithmetic per key step (P rounded to
// f16), keys cut into attention()'s segments and the segments' partials merged in order by
// attention()'s formula. A row's arithmetic depends on its query and its keys alone (not on
// its tile's other rows, nor on how far they reach), so a token's bits depend on neither
// its tile nor its batch. With `partials` (as attention()'s) each segment gets its own
// block and attention_combine merges them: the same bits. head_dim: 32, 64, 96 or 128
// (attention_tc_invariant_supported); the dynamic shared memory per block is
// attention_tc_shared_bytes(head_dim).
cudaError_t attention_tc_invariant(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads,
                                   int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale,
                                   const uint16_t* k_cache, const uint16_t* v_cache, float* out, float* partials,
                                   cudaStream_t stream);
bool attention_tc_invariant_supported(int32_t head_dim);
// attention()'s split-KV second pass alone: partials [n, num_heads, segments, head_dim + 2]
// merged in segment order into out [n, num_heads * head_dim].
cudaError_t attention_combine(const DeviceStep& step, int32_t num_heads, int32_t head_dim, const float* partials,
                              float* out, cudaStream_t stream);
// Attention's keys come in segments of this many positions (0..255, 256..511, ...): each
// segment's partial is merged in order by every attention kernel (common.cuh: merge_step).
constexpr int kAttentionSegment = 256;
// Attention's key segments for a step whose longest context is max_context: the segments
// it needs, rounded up to 1, 2, 3, 4, 6, 8, 12,
// 16, 24, ... (two sizes an octave). It sets the split-KV grid and the partials' stride,
// and goes into launch signatures, so decode steps keep one signature -- and one CUDA
// graph -- while their contexts grow over many segments. A segment past a token's own
// context does nothing (its blocks return at once; the combine merges only the token's
// own segments), so the rounding changes no bit.
inline int attention_segments(int32_t max_context) {
  const int need = max_context <= 0 ? 0 : (max_context - 1) / kAttentionSegment + 1;
  for (int p = 1;; p *= 2) {
    if (need <= p) return need <= 0 ? 0 : p;
    if (p >= 2 && need <= p + p / 2) return p + p / 2;
  }
}
size_t attention_tc_shared_bytes(int32_t head_dim);
// Blocks of attention()'s looped path (one per token and group of up to four query heads
// of a KV head): the split-KV path multiplies them by the segment count.
int64_t attention_loop_blocks(int32_t num_tokens, int32_t num_heads, int32_t num_kv_heads);
// Samples each row of logits [n, vocab] with params[row] (device memory) as the host
// Sampler would (sample.cu): tokens[n] and, where asked, the chosen logprobs[n].
cudaError_t sample(const float* logits, int64_t n, int64_t vocab, const DeviceSampleParams* params, int32_t* tokens,
                   float* logprobs, cudaStream_t stream);
// out [n, ffn] = silu(gate) * up of gate_up [n, 2 ffn]; also in half for cuBLAS (xh).
cudaError_t silu_mul(const float* gate_up, int64_t n, int64_t ffn, float* out, cudaStream_t stream, HalfOut xh = {});
cudaError_t add(float* x, const float* y, int64_t count, cudaStream_t stream);
cudaError_t gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out, cudaStream_t stream);
// out[t] = sum_j w[t k + j] * y[src[t k + j]] in j order; meta = src [n k] then the weights' bits [n k].
cudaError_t moe_combine(const float* y, int64_t dim, const int32_t* meta, int64_t n, int32_t k, float* out,
                        cudaStream_t stream);

}  // namespace troupe::cuda
