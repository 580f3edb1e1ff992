// Where the decode GEMVs' sums go (matmul.cu's gemv_half_rows_kernel, matmul_q8.cu's
// gemv_q8_kernel). A warp takes consecutive items; an item is kRows weight rows, whose warp
// sums (per token) the epilogue stores together. The sums are those of the plain kernels,
// bit for bit (a (row, token)'s arithmetic depends on neither the rows per warp nor the
// batch), and each fused store does what the op it replaces would do with them:
//   RowsOut  -- y[t, r] = row r's sum (the plain GEMV);
//   SiluOut  -- y[t, j] = silu(gate_j) * up_j over gate|up rows, as silu_mul_kernel;
//   RopeKvOut -- the QKV rows, rotated and written to the cache as rope_kv_write_kernel;
//   SiluQ8Out -- SiluOut's values, and (int8 GEMV only) their int8 quantization for the down
//                matmul, as quantize_q8_kernel would write it from them.
// An epilogue with kBlockFinish has finish() called by every thread of the block after the
// block's stores. Only .cu files include this.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quantize_q8.cuh"

namespace troupe::cuda {

struct RowsOut {
  static constexpr int kRows = 1;
  static constexpr bool kBlockFinish = false;
  float* y;
  int64_t ldy, rows;
  __host__ __device__ int64_t items() const { return rows; }
  __host__ __device__ int64_t row(int64_t item, int /*k*/) const { return item; }
  __device__ void store(int64_t t, int64_t item, const float* s) const { y[t * ldy + item] = s[0]; }
};

// The weight holds ffn gate rows, then ffn up rows (model.cpp's fused gate_up).
struct SiluOut {
  static constexpr int kRows = 2;
  static constexpr bool kBlockFinish = false;
  float* y;
  int64_t ldy, ffn;
  __host__ __device__ int64_t items() const { return ffn; }
  __host__ __device__ int64_t row(int64_t item, int k) const { return k * ffn + item; }
  __device__ void store(int64_t t, int64_t item, const float* s) const { y[t * ldy + item] = silu_gate(s[0], s[1]); }
};

// The weight holds the fused QKV rows (q | k | v heads). Items: the rotation pairs of the Q
// and K heads ((i, i + hd/2) for NeoX, (2i, 2i + 1) otherwise), then V's rows two at a time.
// Every value lands in qkv as the unfused matmul + rope_kv_write would leave it, and K (the
// rotated values) and V go to the token's cache slot as f16.
struct RopeKvOut {
  static constexpr int kRows = 2;
  static constexpr bool kBlockFinish = false;
  RopeKvArgs a;
  __host__ __device__ int64_t half() const { return a.head_dim / 2; }
  __host__ __device__ int64_t qk_pairs() const { return (a.num_heads + a.num_kv_heads) * half(); }
  __host__ __device__ int64_t items() const { return qk_pairs() + a.num_kv_heads * half(); }
  // Element of pair i within its head: k = 0 the first of the two, 1 the second.
  __host__ __device__ int64_t pair_elem(int64_t i, int k) const { return a.neox ? i + k * half() : 2 * i + k; }
  __host__ __device__ int64_t row(int64_t item, int k) const {
    const int64_t qk = qk_pairs();
    if (item < qk) return (item / half()) * a.head_dim + pair_elem(item % half(), k);
    return (a.num_heads + a.num_kv_heads) * a.head_dim + 2 * (item - qk) + k;
  }
  __device__ void store(int64_t t, int64_t item, const float* s) const {
    float* r = a.qkv + t * a.ld;
    const int64_t kv_row = a.num_kv_heads * a.head_dim;
    const int64_t slot = a.slots[t];
    const int64_t qk = qk_pairs();
    if (item < qk) {
      const int64_t h = item / half(), i = item % half();
      const int64_t ea = pair_elem(i, 0), eb = pair_elem(i, 1);
      const float* cs = a.cos_sin + t * a.head_dim;
      float y0, y1;
      rope_rotate(s[0], s[1], cs[2 * i], cs[2 * i + 1], &y0, &y1);
      r[h * a.head_dim + ea] = y0;
      r[h * a.head_dim + eb] = y1;
      if (h >= a.num_heads) {
        __half* kc = reinterpret_cast<__half*>(a.k_cache) + slot * kv_row + (h - a.num_heads) * a.head_dim;
        kc[ea] = kv_half(y0);
        kc[eb] = kv_half(y1);
      }
    } else {
      const int64_t j = 2 * (item - qk);
      float* v = r + (a.num_heads + a.num_kv_heads) * a.head_dim;
      v[j] = s[0];
      v[j + 1] = s[1];
      __half* vc = reinterpret_cast<__half*>(a.v_cache) + slot * kv_row;
      vc[j] = kv_half(s[0]);
      vc[j + 1] = kv_half(s[1]);
    }
  }
};

// SiluOut, then the int8 activations of its output (ops.h: SiluQ8Args) for the down
// matmul's int8 GEMV, so that it needs no quantizer launch of its own. A 32-value block of
// the output is finished when every block of the grid that writes part of it has stored;
// the last of them (counted in q.done, one counter per token group and 32-value block)
// reads the block's floats back and quantizes them with quantize_q8_block, so the bytes
// are quantize_q8_kernel's from the same floats. That block resets the counter to zero for
// the next launch. A block's items must lie in one 32-value block (items per block divide 32).
struct SiluQ8Out : SiluOut {
  static constexpr bool kBlockFinish = true;
  SiluQ8Args q;
  // Every thread of the block, after the block's stores: token group blockIdx.y holds the
  // tokens [nt_group * blockIdx.y, ...) of n; the block wrote items [per_block * blockIdx.x, ...).
  // (out of line: inlined, it took up to 213 registers a thread where SiluOut's kernel takes
  // 126 -- ptxas -v, sm_90, NT 8 -- halving the blocks an SM holds)
  __device__ TROUPE_NOINLINE void finish(int64_t n, int nt_group, int per_block) const {
    __shared__ bool s_last;
    const int64_t nb = ffn / 32, first = int64_t{blockIdx.x} * per_block, b = first / 32;
    __threadfence();  // (each thread's stores, before the block is counted)
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t lo = 32 * b, hi = (32 * b + 32 < ffn ? 32 * b + 32 : ffn) - 1;
      const unsigned writers = static_cast<unsigned>(hi / per_block - lo / per_block + 1);
      unsigned* c = q.done + int64_t{blockIdx.y} * nb + b;
      s_last = atomicAdd(c, 1u) + 1 == writers;
      if (s_last) atomicExch(c, 0u);
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();  // (the other writers' stores, before they are read)
    const int64_t t0 = int64_t{blockIdx.y} * nt_group;
    const int nt = n - t0 < nt_group ? static_cast<int>(n - t0) : nt_group;
    const int lane = threadIdx.x & 31;
    const size_t row_bytes = q8_row_bytes(ffn);
    for (int t = threadIdx.x >> 5; t < nt; t += blockDim.x >> 5)
      quantize_q8_block(__ldcg(y + (t0 + t) * ldy + 32 * b + lane), lane, b, nb, q.xq + (t0 + t) * row_bytes, q.nq);
  }
};

}  // namespace troupe::cuda
