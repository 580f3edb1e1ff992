// Runs a CUDA kernel's source on the CPU, one OS thread per CUDA thread, so that kernels
// whose logic is intricate (the sampling kernel) are checked on machines without a GPU
// against the host code they must agree with. Blocks run one after another; __shared__
// variables (function statics here) are therefore per block. __syncthreads is a barrier
// over the block's threads and __shfl_xor_sync an exchange through a per-warp buffer between
// two warp barriers, so every thread must reach them uniformly -- as CUDA requires.
// It checks logic, not timing or memory-model races; a GPU run is still the real test.
//
// Use: #define TROUPE_CUDA_EMULATION, include this, then the .cu file; launch with
// cuda_emu::launch(grid, block, kernel, args...).
#pragma once
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct cuda_emu_dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local cuda_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emu {

struct Block {
  unsigned threads = 0;
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> lanes;  // one slot per thread for shuffles
};
inline Block* current = nullptr;

// grid blocks of `block` threads (a multiple of 32), one block at a time: the same
// threads run every block, meeting at a barrier between blocks (so a thread that returns
// early just waits there, and shared statics are never used by two blocks at once).
template <typename Kernel, typename... Args>
void launch(unsigned grid, unsigned block, Kernel kernel, Args... args) {
  Block blk;
  blk.threads = block;
  blk.all = std::make_unique<std::barrier<>>(block);
  for (unsigned w = 0; w < block / 32; ++w) blk.warps.push_back(std::make_unique<std::barrier<>>(32));
  blk.lanes.assign(block, 0);
  std::barrier<> block_end(block);
  current = &blk;
  std::vector<std::thread> ts;
  ts.reserve(block);
  for (unsigned t = 0; t < block; ++t)
    ts.emplace_back([=, &block_end] {
      threadIdx.x = t;
      blockDim.x = block;
      gridDim.x = grid;
      for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        kernel(args...);
        block_end.arrive_and_wait();
      }
    });
  for (auto& t : ts) t.join();
  current = nullptr;
}

// A grid of gx x gy x gz blocks: one launch() per (y, z), its threads setting blockIdx.y/z.
template <typename Kernel, typename... Args>
void launch3(unsigned gx, unsigned gy, unsigned gz, unsigned block, Kernel kernel, Args... args) {
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      launch(gx, block, [=](auto... xs) {
        blockIdx.y = y;
        blockIdx.z = z;
        kernel(xs...);
      }, args...);
}

}  // namespace cuda_emu

inline void __syncthreads() { cuda_emu::current->all->arrive_and_wait(); }

template <typename T>
T __shfl_xor_sync(unsigned /*mask: full warps only*/, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  auto& blk = *cuda_emu::current;
  const unsigned me = threadIdx.x, warp = me / 32, partner = (me & ~31u) | ((me & 31u) ^ static_cast<unsigned>(lane_mask));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  blk.lanes[me] = bits;
  blk.warps[warp]->arrive_and_wait();
  const uint64_t theirs = blk.lanes[partner];
  blk.warps[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &theirs, sizeof(T));
  return out;
}

// Lane `src` of the warp's value (every lane calls it).
template <typename T>
T __shfl_sync(unsigned /*mask: full warps only*/, T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  auto& blk = *cuda_emu::current;
  const unsigned me = threadIdx.x, warp = me / 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  blk.lanes[me] = bits;
  blk.warps[warp]->arrive_and_wait();
  const uint64_t theirs = blk.lanes[(me & ~31u) | (static_cast<unsigned>(src) & 31u)];
  blk.warps[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &theirs, sizeof(T));
  return out;
}

template <typename T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}

// Rounding intrinsics: one IEEE operation each (the host compiler may not contract them;
// nvcc's contraction of plain expressions is therefore not reproduced here).
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }  // half to even
// Four signed 8-bit products summed into c.
inline int __dp4a(int a, int b, int c) {
  for (int k = 0; k < 4; ++k)
    c += static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * k))) *
         static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * k)));
  return c;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }  // (CUDA's is within 2 ulp of this)
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  cuda_emu::current->warps[threadIdx.x / 32]->arrive_and_wait();
}
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
template <typename T>
T __ldcs(const T* p) {  // a streaming load: a plain load here
  return *p;
}
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
using std::isnan;
using std::max;
using std::min;

// WMMA (16 x 16 x 16, f16 or bf16 inputs, f32 accumulators). Each thread's fragment holds the whole tile, so loads need no
// exchange and every lane computes the same product (in double, rounded to float: the
// tensor cores' own accumulation order is unspecified); lane 0 alone stores, and kernels
// __syncwarp() before reading what was stored, as CUDA requires.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation knows 16 x 16 x 16 only");
  // The whole tile, (row, col) at x[row * 16 + col]: the same element of two fragments of
  // one type has one index, as CUDA promises (element-wise arithmetic on x is portable).
  static constexpr int num_elements = 256;
  float x[256];
  float& at(int r, int c) { return x[r * 16 + c]; }
  float at(int r, int c) const { return x[r * 16 + c]; }
};
template <typename U, typename T, typename L>
void fill_fragment(fragment<U, 16, 16, 16, T, L>& f, float v) {
  for (auto& e : f.x) e = v;
}
inline float emu_load(const __half* p) { return __half2float(*p); }
inline float emu_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
inline float emu_load(const float* p) { return *p; }
template <typename U, typename T, typename L, typename P>
void load_matrix_sync(fragment<U, 16, 16, 16, T, L>& f, const P* p, unsigned ldm) {
  static_assert(std::is_same_v<std::remove_cv_t<P>, T>, "the pointer's type is the fragment's");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.at(r, c) = emu_load(std::is_same_v<L, col_major> ? p + c * ldm + r : p + r * ldm + c);
}
template <typename T>
void load_matrix_sync(fragment<accumulator, 16, 16, 16, T, void>& f, const float* p, unsigned ldm, layout_t l) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.at(r, c) = l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float, void>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float, void>& c) {
  float out[256];
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      double acc = c.at(r, col);
      for (int k = 0; k < 16; ++k) acc += double(a.at(r, k)) * b.at(k, col);
      out[r * 16 + col] = static_cast<float>(acc);
    }
  std::memcpy(d.x, out, sizeof(out));
}
template <typename T>
void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, T, void>& f, unsigned ldm, layout_t l) {
  if ((threadIdx.x & 31) != 0) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.at(r, c);
}
}  // namespace nvcuda::wmma
