// Batch-invariant matmul on tensor cores for f16/bf16 weights (--cuda-tc-gemm): y[t, r] =
// sum_k W[r, k] x[t, k] with x rounded to the weight's type and f32 accumulation (WMMA
// 16 x 16 x 16). Every output element is computed by one fixed recipe, whatever the number
// of tokens or the kernel that runs it:
//   total = 0; for each slice of kSlice columns, in order:
//     acc = 0; for each 16-column chunk of the slice, in order: acc = mma(W chunk, x chunk, acc)
//     total = total + acc            (one f32 addition)
// An mma's output element depends only on its own row of W, its own token's x and its own
// accumulator, so a token's result never depends on its batch neighbours. Two kernels
// follow the recipe: a small-batch one (decode; up to kSmallMaxTokens tokens, a block per
// 16 rows and 16 tokens, the block's warps taking one slice each so that a 4096-column
// matrix keeps eight warps busy per 16 rows) and a tiled one (a block per 128 rows x 64
// tokens, W and x staged through shared memory, the slice totals folded in registers).
// tests/kernels/gemm_tc_emu_test.cpp runs this source on the CPU and checks that both
// kernels give the same bits.
#include <algorithm>
#include <type_traits>

#ifndef TROUPE_CUDA_EMULATION
#include <mma.h>
#endif

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {

namespace {

using namespace nvcuda;
constexpr int kF = 16;                   // WMMA tile: 16 x 16 x 16
constexpr int kSlice = 512;              // columns per accumulation chain
constexpr int kTokenPad = 16;            // the converted activations have rows up to a multiple of this
constexpr int64_t kSmallMaxTokens = 32;  // up to this many tokens: the small-batch kernel

// x [n, ldx] f32 -> xh [n_pad, kp] in the weight's half type, zero past cols and past n:
// to_half_rows_kernel (common.cuh). (For f16 weights an activation beyond f16's range,
// 65504, becomes +-inf, as on the cuBLAS path.)

// ---- small batches --------------------------------------------------------------------
constexpr int kSmallWarps = 8;
constexpr int kStageK = 64;                     // columns of W a warp stages at a time (27 KB of shared memory a block)
constexpr int kPieces = kStageK / 8;            // 16-byte pieces per staged row
constexpr int kLanePieces = kF * kPieces / 32;  // per lane and stage
constexpr int kPadA = 8;                        // row padding of the staged W (keeps 32-byte alignment)

template <typename H>
struct alignas(32) SmallShared {
  H a[kSmallWarps][kF][kStageK + kPadA];  // each warp's staged rows of W
  float part[kSmallWarps][kF * kF];       // the round's slice results, [row][token]
  float total[kF * kF];
};

// A warp's 16-byte pieces of W rows r0 .. r0 + 15, columns kk .. kk + kStageK - 1 (zero
// past the matrix or past k1).
template <typename H>
__device__ __forceinline__ void load_stage(const H* w, int64_t ldw, int64_t rows, int64_t r0, int64_t kk, int64_t k1,
                                           int lane, uint4* reg) {
#pragma unroll
  for (int j = 0; j < kLanePieces; ++j) {
    const int i = lane + 32 * j, r = i / kPieces, c = i % kPieces;
    const int64_t k = kk + 8 * c;
    reg[j] = r0 + r < rows && k < k1 ? *reinterpret_cast<const uint4*>(w + (r0 + r) * ldw + k) : make_uint4(0, 0, 0, 0);
  }
}

template <typename H>
__global__ void __launch_bounds__(kSmallWarps * 32)
    gemm_tc_small_kernel(const H* __restrict__ w, int64_t ldw, int64_t rows, int64_t kp, const H* __restrict__ xh,
                         int64_t n, float* __restrict__ y, int64_t ldy) {
  __shared__ SmallShared<H> s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = int64_t{blockIdx.x} * kF, t0 = int64_t{blockIdx.y} * kF;
  const int slices = static_cast<int>((kp + kSlice - 1) / kSlice);
  for (int i = threadIdx.x; i < kF * kF; i += kSmallWarps * 32) s.total[i] = 0.0f;
  for (int round = 0; round < slices; round += kSmallWarps) {
    const int sl = round + warp;
    if (sl < slices) {  // warp-uniform
      wmma::fragment<wmma::accumulator, kF, kF, kF, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      const int64_t k0 = int64_t{sl} * kSlice, k1 = min(kp, k0 + kSlice);
      uint4 reg[kLanePieces];
      load_stage(w, ldw, rows, r0, k0, k1, lane, reg);
      for (int64_t kk = k0; kk < k1; kk += kStageK) {
        __syncwarp();  // the last stage's fragments are loaded
#pragma unroll
        for (int j = 0; j < kLanePieces; ++j) {
          const int i = lane + 32 * j;
          *reinterpret_cast<uint4*>(&s.a[warp][i / kPieces][8 * (i % kPieces)]) = reg[j];
        }
        __syncwarp();
        if (kk + kStageK < k1) load_stage(w, ldw, rows, r0, kk + kStageK, k1, lane, reg);  // in flight meanwhile
        const int width = static_cast<int>(min(int64_t{kStageK}, k1 - kk));  // a multiple of 32 (slices: of 64)
        for (int c = 0; c < width; c += kF) {
          wmma::fragment<wmma::matrix_a, kF, kF, kF, H, wmma::row_major> fa;
          wmma::fragment<wmma::matrix_b, kF, kF, kF, H, wmma::col_major> fb;
          wmma::load_matrix_sync(fa, &s.a[warp][0][c], kStageK + kPadA);
          wmma::load_matrix_sync(fb, xh + t0 * kp + kk + c, static_cast<unsigned>(kp));
          wmma::mma_sync(acc, fa, fb, acc);
        }
      }
      wmma::store_matrix_sync(s.part[warp], acc, kF, wmma::mem_row_major);
    }
    __syncthreads();
    const int active = min(kSmallWarps, slices - round);
    for (int i = threadIdx.x; i < kF * kF; i += kSmallWarps * 32) {
      float t = s.total[i];
      for (int p = 0; p < active; ++p) t = __fadd_rn(t, s.part[p][i]);
      s.total[i] = t;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < kF * kF; i += kSmallWarps * 32) {
    const int r = i % kF, t = i / kF;
    if (r0 + r < rows && t0 + t < n) y[(t0 + t) * ldy + r0 + r] = s.total[r * kF + t];
  }
}

// ---- large batches --------------------------------------------------------------------
constexpr int kBM = 128, kBN = 64, kBK = 32, kLargeWarps = 8;  // warps: 4 along rows x 2 along tokens
constexpr int kPadT = 8;

template <typename H>
struct alignas(32) LargeShared {
  H a[2][kBM][kBK + kPadT];  // W tile, double-buffered
  H b[2][kBN][kBK + kPadT];  // x tile [token][column]
  float out[kLargeWarps][kF * kF];
};

template <typename H>
__global__ void __launch_bounds__(kLargeWarps * 32)
    gemm_tc_large_kernel(const H* __restrict__ w, int64_t ldw, int64_t rows, int64_t kp, const H* __restrict__ xh,
                         int64_t n, float* __restrict__ y, int64_t ldy) {
  __shared__ LargeShared<H> s;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wr = warp % 4, wt = warp / 4;  // the warp's 32 rows and 32 tokens of the tile
  const int64_t r0 = int64_t{blockIdx.x} * kBM, t0 = int64_t{blockIdx.y} * kBN;
  const int stages = static_cast<int>(kp / kBK);  // kp is a multiple of 32
  constexpr int kStagesPerSlice = kSlice / kBK;
  // Per stage: W 128 rows x 4 pieces (two per thread), x 64 tokens x 4 pieces (one each).
  uint4 ra[2], rb;
  auto load = [&](int st) {
    const int64_t k = int64_t{st} * kBK;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = tid + 256 * j, r = i / 4, c = i % 4;
      ra[j] = r0 + r < rows ? *reinterpret_cast<const uint4*>(w + (r0 + r) * ldw + k + 8 * c) : make_uint4(0, 0, 0, 0);
    }
    const int t = tid / 4, c = tid % 4;
    rb = t0 + t < n ? *reinterpret_cast<const uint4*>(xh + (t0 + t) * kp + k + 8 * c) : make_uint4(0, 0, 0, 0);
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = tid + 256 * j;
      *reinterpret_cast<uint4*>(&s.a[buf][i / 4][8 * (i % 4)]) = ra[j];
    }
    *reinterpret_cast<uint4*>(&s.b[buf][tid / 4][8 * (tid % 4)]) = rb;
  };
  wmma::fragment<wmma::accumulator, kF, kF, kF, float> acc[2][2], total[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::fill_fragment(acc[i][j], 0.0f);
      wmma::fill_fragment(total[i][j], 0.0f);
    }
  load(0);
  store(0);
  __syncthreads();
  for (int st = 0; st < stages; ++st) {
    const int buf = st & 1;
    if (st + 1 < stages) load(st + 1);  // in flight during the mma
#pragma unroll
    for (int c = 0; c < kBK; c += kF) {
      wmma::fragment<wmma::matrix_a, kF, kF, kF, H, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, kF, kF, kF, H, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &s.a[buf][wr * 32 + i * kF][c], kBK + kPadT);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &s.b[buf][wt * 32 + j * kF][c], kBK + kPadT);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    if (st + 1 < stages) store(buf ^ 1);
    __syncthreads();
    if ((st + 1) % kStagesPerSlice == 0 || st + 1 == stages) {  // the slice is done: fold it
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int e = 0; e < total[i][j].num_elements; ++e)
            total[i][j].x[e] = __fadd_rn(total[i][j].x[e], acc[i][j].x[e]);
          wmma::fill_fragment(acc[i][j], 0.0f);
        }
    }
  }
  // Through the warp's shared tile, so that only elements inside the matrix are written.
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(s.out[warp], total[i][j], kF, wmma::mem_row_major);
      __syncwarp();
      const int64_t rb0 = r0 + wr * 32 + i * kF, tb0 = t0 + wt * 32 + j * kF;
      for (int e = lane; e < kF * kF; e += 32) {
        const int r = e % kF, t = e / kF;
        if (rb0 + r < rows && tb0 + t < n) y[(tb0 + t) * ldy + rb0 + r] = s.out[warp][r * kF + t];
      }
      __syncwarp();
    }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION
namespace {

template <typename H>
cudaError_t launch_tc(const H* w, int64_t ldw, int64_t rows, int64_t cols, const float* x, int64_t ldx, int64_t n,
                      H* xh, float* y, int64_t ldy, cudaStream_t stream) {
  const int64_t kp = ldw, n_pad = (n + kTokenPad - 1) / kTokenPad * kTokenPad;
  const cudaError_t e = to_half_rows(x, ldx, n, cols, kp, n_pad, xh, std::is_same_v<H, __nv_bfloat16>, stream);
  if (e != cudaSuccess) return e;
  if (n <= kSmallMaxTokens) {
    const dim3 grid(static_cast<unsigned>((rows + kF - 1) / kF), static_cast<unsigned>(n_pad / kF));
    gemm_tc_small_kernel<H><<<grid, kSmallWarps * 32, 0, stream>>>(w, ldw, rows, kp, xh, n, y, ldy);
  } else {
    const dim3 grid(static_cast<unsigned>((rows + kBM - 1) / kBM), static_cast<unsigned>((n + kBN - 1) / kBN));
    gemm_tc_large_kernel<H><<<grid, kLargeWarps * 32, 0, stream>>>(w, ldw, rows, kp, xh, n, y, ldy);
  }
  return cudaGetLastError();
}

}  // namespace

bool has_gemm_tc(DType type) { return type == DType::F16 || type == DType::BF16; }

size_t gemm_tc_scratch_bytes(size_t row_bytes, int64_t n) {
  const int64_t n_pad = (n + kTokenPad - 1) / kTokenPad * kTokenPad;
  return static_cast<size_t>(n_pad) * row_bytes;
}

cudaError_t gemm_tc(DType type, const void* w, size_t row_bytes, int64_t rows, int64_t cols, const float* x,
                    int64_t ldx, int64_t n, void* scratch, float* y, int64_t ldy, cudaStream_t stream) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  const int64_t ldw = static_cast<int64_t>(row_bytes / 2);
  if (!has_gemm_tc(type) || row_bytes % 64 != 0 || ldw <= 0 || ldw < cols || n > (int64_t{65535} * kBN))
    return cudaErrorInvalidValue;
  if (type == DType::F16)
    return launch_tc(static_cast<const __half*>(w), ldw, rows, cols, x, ldx, n, static_cast<__half*>(scratch), y, ldy,
                     stream);
  return launch_tc(static_cast<const __nv_bfloat16*>(w), ldw, rows, cols, x, ldx, n,
                   static_cast<__nv_bfloat16*>(scratch), y, ldy, stream);
}

#endif

}  // namespace troupe::cuda
