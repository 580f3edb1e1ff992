// Prefill attention on tensor cores (WMMA, f16 inputs, f32 accumulation), for the
// non-batch-invariant mode (--cuda-cublas): flash-attention style over the paged cache.
// A block is four warps and a tile of 16 consecutive step tokens that belong to one
// sequence ("uniform" tiles: the others, at sequence boundaries, stay with attention.cu's
// per-token kernel, which skips the uniform ones); warp w takes query head w of a group of
// up to four heads sharing one KV head (GQA: each K/V tile is loaded once for the group;
// where a group has fewer heads the spare warps repeat the last one and write nothing).
// Per tile of tc_keys() keys, loaded by the whole block: S = Q K^T (tensor cores, Q's
// fragments kept in registers), then per row the online softmax (running max and sum, the
// output rescaled), P rounded to f16, and O += P V (tensor cores). K, V, S, P and O live in
// shared memory between the steps, so no fragment's element layout is ever assumed; rows
// are padded (8 halves, 4 floats) against bank conflicts. The shared memory is dynamic
// (47-116 KB by head size: attention_tc_shared_bytes()).
// The same key steps serve every token in the batch-invariant mode with TROUPE_CUDA_ATTN=tc
// (attention_tc_invariant, ops.h): tiles of up to 16 tokens of one sequence from the step's
// tile table, keys in attention.cu's 256-key segments whose partials are merged in order
// by its formula (in the block, or split-KV with attention.cu's combine), and every float
// operation of a row written with explicit rounding, so a row's bits depend on its query
// and keys alone.
// tests/kernels/attention_emu_test.cpp runs this source on the CPU.
#include <atomic>
#include <cmath>

#ifndef TROUPE_CUDA_EMULATION
#include <mma.h>
#endif

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {

namespace {

using namespace nvcuda;
constexpr int kT = 16;       // queries per tile; WMMA's 16 x 16 x 16
constexpr int kTcWarps = 4;  // query heads per block
template <int HD>
constexpr int tc_keys() {  // keys per step: fewer for wide heads, so the block fits an SM
  return HD <= 128 ? 64 : 32;
}

template <int HD>
struct alignas(32) TcShared {  // (WMMA loads and stores need 32-byte aligned tiles)
  static constexpr int KT = tc_keys<HD>();
  static constexpr int kLdH = HD + 8, kLdO = HD + 4, kLdS = KT + 4, kLdP = KT + 8;
  __half k[KT][kLdH];
  __half v[KT][kLdH];
  float s[kTcWarps][kT][kLdS];
  __half p[kTcWarps][kT][kLdP];
  float o[kTcWarps][kT][kLdO];  // (each warp's queries are staged here first, as halves)
  float m[kTcWarps][kT], l[kTcWarps][kT], corr[kTcWarps][kT];
  float mt[kTcWarps][kT], lt[kTcWarps][kT];  // the merged segments' max and sum (kLooped)
  int pos[kT];
};

// What the kernel does with its tile (one template each):
//   kUniform: tiles of 16 consecutive step tokens that are all of one sequence (others are
//             left to attention.cu), every key in one online softmax (--cuda-cublas);
//   kLooped:  the tiles of step.tiles, keys in kAttentionSegment segments, each segment's
//             partial merged in order (merge_step) in the block (batch-invariant);
//   kSplit:   as kLooped, one segment (blockIdx.z) a block, its partials written for
//             attention_combine (the same bits).
enum TcMode { kUniform, kLooped, kSplit };

struct TcArgs {
  DeviceStep st;
  const float* q;
  int64_t ld_q;
  int num_heads, num_kv_heads, block_size;
  float scale;
  const __half* kc;
  const __half* vc;
  float* out;
  float* partials;  // kSplit: [num_tokens, num_heads, max_segments, HD + 2]
  int max_segments;
  HalfOut xh;  // kUniform, p non-null: the output in half too, for cuBLAS (ops.h)
};

// This warp's segment state (s.m, s.l, s.o) emptied, for a new online softmax.
template <int HD>
__device__ __forceinline__ void tc_reset(TcShared<HD>& s, int warp, int lane) {
  if (lane < kT) {
    s.m[warp][lane] = -INFINITY;
    s.l[warp][lane] = 0.0f;
  }
  for (int i = lane; i < kT * TcShared<HD>::kLdO; i += 32) (&s.o[warp][0][0])[i] = 0.0f;
}

// One key step: keys k0 .. k0 + KT - 1 (those past `last` read as zero) loaded by the whole
// block, then for this warp's rows S = Q K^T, the online softmax over the keys up to each
// row's position, and O += P V. A row whose position is below k0 is left exactly as it was
// (its correction is 1, its P zero), so the steps a tile takes beyond a row's own keys do
// not change that row's bits.
template <int HD, typename QFrag>
__device__ __forceinline__ void tc_key_step(const TcArgs& a, TcShared<HD>& s, const int32_t* bt, int kvh, int k0,
                                            int last, const QFrag (&qa)[HD / kT]) {
  using S = TcShared<HD>;
  constexpr int KT = S::KT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t{a.num_kv_heads} * HD;
  for (int i = threadIdx.x; i < KT * (HD / 8); i += kTcWarps * 32) {
    const int j = i / (HD / 8), c = i % (HD / 8), p = k0 + j;
    uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
    if (p <= last) {
      const int64_t slot = static_cast<int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
      kv = reinterpret_cast<const uint4*>(a.kc + slot * row + int64_t{kvh} * HD)[c];
      vv = reinterpret_cast<const uint4*>(a.vc + slot * row + int64_t{kvh} * HD)[c];
    }
    reinterpret_cast<uint4*>(&s.k[j][0])[c] = kv;
    reinterpret_cast<uint4*>(&s.v[j][0])[c] = vv;
  }
  __syncthreads();
  // S = Q K^T, 16 keys at a time.
#pragma unroll
  for (int n = 0; n < KT / kT; ++n) {
    wmma::fragment<wmma::accumulator, kT, kT, kT, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int c = 0; c < HD / kT; ++c) {
      wmma::fragment<wmma::matrix_b, kT, kT, kT, __half, wmma::col_major> b;
      wmma::load_matrix_sync(b, &s.k[n * kT][c * kT], S::kLdH);  // (d, key) at k[key][d]: K^T
      wmma::mma_sync(acc, qa[c], b, acc);
    }
    wmma::store_matrix_sync(&s.s[warp][0][n * kT], acc, S::kLdS, wmma::mem_row_major);
  }
  __syncwarp();
  // The online softmax, two lanes a row (each half the keys; causal mask: key > the
  // row's position).
  {
    const int r = lane >> 1, half = lane & 1, pr = s.pos[r];
    const int j0 = half * (KT / 2), j1 = j0 + KT / 2;
    float mx = -INFINITY;
    for (int j = j0; j < j1; ++j)
      if (k0 + j <= pr) mx = fmaxf(mx, __fmul_rn(s.s[warp][r][j], a.scale));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = s.m[warp][r];
    const bool any = pr >= k0;  // the row has keys in this tile
    const float mn = fmaxf(m_old, mx);
    const float corr = any ? expf(__fsub_rn(m_old, mn)) : 1.0f;
    float sum = 0.0f;
    for (int j = j0; j < j1; ++j) {
      const float pj = k0 + j <= pr ? expf(__fsub_rn(__fmul_rn(s.s[warp][r][j], a.scale), mn)) : 0.0f;
      const __half ph = __float2half_rn(pj);
      s.p[warp][r][j] = ph;
      sum = __fadd_rn(sum, __half2float(ph));
    }
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
    __syncwarp();  // (both lanes of the row have read s.m)
    if (half == 0) {
      if (any) {
        s.m[warp][r] = mn;
        s.l[warp][r] = __fmaf_rn(s.l[warp][r], corr, sum);
      }
      s.corr[warp][r] = corr;
    }
  }
  __syncwarp();
  for (int i = lane; i < kT * HD; i += 32)
    s.o[warp][i / HD][i % HD] = __fmul_rn(s.o[warp][i / HD][i % HD], s.corr[warp][i / HD]);
  __syncwarp();
  // O += P V, one 16-column slice of O at a time.
#pragma unroll
  for (int d = 0; d < HD / kT; ++d) {
    wmma::fragment<wmma::accumulator, kT, kT, kT, float> acc;
    wmma::load_matrix_sync(acc, &s.o[warp][0][d * kT], S::kLdO, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < KT / kT; ++kk) {
      wmma::fragment<wmma::matrix_a, kT, kT, kT, __half, wmma::row_major> pa;
      wmma::fragment<wmma::matrix_b, kT, kT, kT, __half, wmma::row_major> b;
      wmma::load_matrix_sync(pa, &s.p[warp][0][kk * kT], S::kLdP);
      wmma::load_matrix_sync(b, &s.v[kk * kT][d * kT], S::kLdH);
      wmma::mma_sync(acc, pa, b, acc);
    }
    wmma::store_matrix_sync(&s.o[warp][0][d * kT], acc, S::kLdO, wmma::mem_row_major);
  }
  __syncthreads();  // (every warp is done with this K/V tile, and its O is stored)
}

template <int HD, int kMode>
__global__ void __launch_bounds__(kTcWarps * 32) attention_tc_kernel(TcArgs a) {
  using S = TcShared<HD>;
  constexpr int KT = S::KT;
  static_assert(kAttentionSegment % KT == 0, "a segment is whole key steps");
  static_assert(kMode == kUniform || HD <= 128, "kLooped keeps HD / 2 output values a lane in registers");
#ifdef TROUPE_CUDA_EMULATION
  __shared__ S s_block;  // (a static: the emulation runs blocks one after another)
  S& s = s_block;
#else
  extern __shared__ __align__(128) unsigned char tc_smem[];
  S& s = *reinterpret_cast<S*>(tc_smem);
#endif
  const DeviceStep& st = a.st;
  int t0, rows;
  if constexpr (kMode == kUniform) {
    if (!tc_tile_uniform(st.token_seq, st.num_tokens, blockIdx.x))
      return;  // the whole block: attention.cu's kernel does it
    t0 = blockIdx.x * kT;
    rows = min(kT, st.num_tokens - t0);
  } else {
    t0 = st.tiles[blockIdx.x];
    rows = min(st.tiles[blockIdx.x + 1] - t0, kT);  // (0 past the last tile: the grid has a block per token)
    if (rows <= 0) return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = a.num_heads / a.num_kv_heads, chunks = (group + kTcWarps - 1) / kTcWarps;
  const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * kTcWarps;
  const int gn = min(kTcWarps, group - g0);
  const bool active = warp < gn;
  const int h = kvh * group + g0 + (active ? warp : gn - 1);
  const int32_t* bt = st.block_tables + static_cast<int64_t>(st.token_seq[t0]) * st.max_blocks_per_seq;
  // This warp's queries (rounded to f16; rows past the tile are zero) into registers,
  // through its O rows; then the running state.
  __half* qs = reinterpret_cast<__half*>(&s.o[warp][0][0]);
  for (int i = lane; i < kT * HD; i += 32) {
    const int r = i / HD, d = i % HD;
    qs[r * S::kLdH + d] = __float2half_rn(r < rows ? a.q[(t0 + r) * a.ld_q + int64_t{h} * HD + d] : 0.0f);
  }
  if (threadIdx.x < kT) s.pos[threadIdx.x] = static_cast<int>(threadIdx.x) < rows ? st.positions[t0 + threadIdx.x] : -1;
  __syncwarp();
  wmma::fragment<wmma::matrix_a, kT, kT, kT, __half, wmma::row_major> qa[HD / kT];
#pragma unroll
  for (int c = 0; c < HD / kT; ++c) wmma::load_matrix_sync(qa[c], qs + c * kT, S::kLdH);
  __syncwarp();
  tc_reset(s, warp, lane);
  __syncthreads();  // (s.pos, written by warp 0, is read by every warp)
  int last = -1;    // the tile's keys: 0 .. last
  for (int r = 0; r < rows; ++r) last = max(last, s.pos[r]);
  if (last < 0) return;  // (no keys: not a valid step; the whole block)
  if constexpr (kMode == kUniform) {
    for (int k0 = 0; k0 <= last; k0 += KT) tc_key_step<HD>(a, s, bt, kvh, k0, last, qa);
    if (!active) return;
    for (int i = lane; i < rows * HD; i += 32) {
      const int r = i / HD, d = i % HD;
      const int64_t o = (static_cast<int64_t>(t0 + r) * a.num_heads + h) * HD + d;
      const float v = s.o[warp][r][d] / s.l[warp][r];
      a.out[o] = v;
      if (a.xh.p) store_half(a.xh, o, v);
    }
  } else if constexpr (kMode == kSplit) {
    const int kb = blockIdx.z * kAttentionSegment;
    if (kb > last) return;  // (the whole block)
    for (int k0 = kb; k0 <= min(kb + kAttentionSegment - 1, last); k0 += KT)
      tc_key_step<HD>(a, s, bt, kvh, k0, last, qa);
    if (!active) return;
    // Rows with keys in this segment: the partial as attention.cu's split kernel lays it out.
    for (int i = lane; i < rows * (HD + 2); i += 32) {
      const int r = i / (HD + 2), d = i % (HD + 2);
      if (s.pos[r] < kb) continue;
      float* p =
          a.partials + ((static_cast<int64_t>(t0 + r) * a.num_heads + h) * a.max_segments + blockIdx.z) * (HD + 2);
      p[d] = d < HD ? s.o[warp][r][d] : d == HD ? s.m[warp][r] : s.l[warp][r];
    }
  } else {
    // The merged segments: this lane's output values i = lane + 32 j (row i / HD, column
    // i % HD) in registers, each row's max and sum in s.mt, s.lt.
    constexpr int kPer = kT * HD / 32;
    float acc[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc[j] = 0.0f;
    if (lane < kT) {
      s.mt[warp][lane] = -INFINITY;
      s.lt[warp][lane] = 0.0f;
    }
    for (int kb = 0; kb <= last; kb += kAttentionSegment) {
      for (int k0 = kb; k0 <= min(kb + kAttentionSegment - 1, last); k0 += KT)
        tc_key_step<HD>(a, s, bt, kvh, k0, last, qa);
        // Rows with keys in this segment merge its partial, as attention_combine_kernel does.
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = lane + 32 * j, r = i / HD, d = i % HD;
        if (s.pos[r] < kb) continue;
        float m = s.mt[warp][r], l = s.lt[warp][r];
        merge_step(m, l, acc[j], s.m[warp][r], s.l[warp][r], s.o[warp][r][d]);
      }
      __syncwarp();  // (every lane has read s.mt, s.lt and this segment's O)
      if (lane < kT && s.pos[lane] >= kb) {
        float unused = 0.0f;
        merge_step(s.mt[warp][lane], s.lt[warp][lane], unused, s.m[warp][lane], s.l[warp][lane], 0.0f);
      }
      tc_reset(s, warp, lane);
      __syncwarp();
    }
    if (!active) return;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = lane + 32 * j, r = i / HD, d = i % HD;
      if (r < rows) a.out[(static_cast<int64_t>(t0 + r) * a.num_heads + h) * HD + d] = __fdiv_rn(acc[j], s.lt[warp][r]);
    }
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernel above on the CPU)
size_t attention_tc_shared_bytes(int32_t head_dim) {
  switch (head_dim) {
    case 32:
      return sizeof(TcShared<32>);
    case 64:
      return sizeof(TcShared<64>);
    case 96:
      return sizeof(TcShared<96>);
    case 128:
      return sizeof(TcShared<128>);
    case 160:
      return sizeof(TcShared<160>);
    case 192:
      return sizeof(TcShared<192>);
    case 256:
      return sizeof(TcShared<256>);
    default:
      return 0;
  }
}

bool attention_tc_invariant_supported(int32_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128;
}

namespace {
template <int HD, int kMode>
cudaError_t launch_tc(const dim3& grid, const TcArgs& a, cudaStream_t stream) {
  constexpr size_t bytes = sizeof(TcShared<HD>);
  static std::atomic<uint64_t> opted{0};  // (per head size and mode)
  if (const cudaError_t e =
          opt_in_shared_memory(reinterpret_cast<const void*>(attention_tc_kernel<HD, kMode>), bytes, opted);
      e != cudaSuccess)
    return e;
  attention_tc_kernel<HD, kMode><<<grid, kTcWarps * 32, bytes, stream>>>(a);
  return cudaGetLastError();
}

template <int kMode>
cudaError_t launch_tc_mode(const dim3& grid, const TcArgs& a, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 32:
      return launch_tc<32, kMode>(grid, a, stream);
    case 64:
      return launch_tc<64, kMode>(grid, a, stream);
    case 96:
      return launch_tc<96, kMode>(grid, a, stream);
    case 128:
      return launch_tc<128, kMode>(grid, a, stream);
    default:
      break;
  }
  if constexpr (kMode == kUniform) {
    switch (head_dim) {
      case 160:
        return launch_tc<160, kMode>(grid, a, stream);
      case 192:
        return launch_tc<192, kMode>(grid, a, stream);
      case 256:
        return launch_tc<256, kMode>(grid, a, stream);
      default:
        break;
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t attention_tc(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                         int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                         const uint16_t* v_cache, float* out, cudaStream_t stream, HalfOut xh) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  const TcArgs a{step,
                 q,
                 ld_q,
                 num_heads,
                 num_kv_heads,
                 block_size,
                 scale,
                 reinterpret_cast<const __half*>(k_cache),
                 reinterpret_cast<const __half*>(v_cache),
                 out,
                 nullptr,
                 0,
                 xh};
  const dim3 grid(static_cast<unsigned>((step.num_tokens + kT - 1) / kT),
                  gqa_head_blocks(num_heads, num_kv_heads, kTcWarps));
  return launch_tc_mode<kUniform>(grid, a, head_dim, stream);
}

cudaError_t attention_tc_invariant(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads,
                                   int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale,
                                   const uint16_t* k_cache, const uint16_t* v_cache, float* out, float* partials,
                                   cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || !step.tiles || !attention_tc_invariant_supported(head_dim))
    return cudaErrorInvalidValue;
  const int segs = attention_segments(step.max_context);
  const TcArgs a{step,
                 q,
                 ld_q,
                 num_heads,
                 num_kv_heads,
                 block_size,
                 scale,
                 reinterpret_cast<const __half*>(k_cache),
                 reinterpret_cast<const __half*>(v_cache),
                 out,
                 partials,
                 segs,
                 {}};
  // A block per token bounds the tiles (a tile holds at least one): those past the last
  // tile return at once. The grid thus depends on the step's shape alone.
  const unsigned tiles = static_cast<unsigned>(step.num_tokens),
                 ys = gqa_head_blocks(num_heads, num_kv_heads, kTcWarps);
  if (!partials) return launch_tc_mode<kLooped>(dim3(tiles, ys), a, head_dim, stream);
  if (const cudaError_t e = launch_tc_mode<kSplit>(dim3(tiles, ys, static_cast<unsigned>(segs)), a, head_dim, stream);
      e != cudaSuccess)
    return e;
  return attention_combine(step, num_heads, head_dim, partials, out, stream);
}
#endif

}  // namespace troupe::cuda
