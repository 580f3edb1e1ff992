// Runs a CUDA kernel's source on the CPU, one fiber per CUDA thread, so that kernels
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
#include <cstdio>
#include <cstdlib>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <new>
#include <string>
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

// CUDA threads are fibers on the calling OS thread (stack switching, a few nanoseconds a
// switch; the first version's OS thread per CUDA thread spent its time waking threads at
// barriers). A fiber runs until it waits at a barrier or returns, then switches straight
// to the next thread of the block that can run, round-robin; a barrier opens when all its
// threads have arrived. Threads that can never go on (they wait at different barriers, or
// for one an exited thread never reaches) are a deadlock on a GPU too: reported, then
// abort().
extern "C" void troupe_emu_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *save_sp,
// then loads load_sp and restores them from there. (Not MXCSR or the x87 control word:
// no kernel changes rounding modes, so every fiber has the thread's.)
asm(R"(
  .text
  .weak troupe_emu_switch
  .hidden troupe_emu_switch
  .type troupe_emu_switch,@function
troupe_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size troupe_emu_switch, .-troupe_emu_switch
)");
#else
#error "tests/kernels/cuda_emulation.h switches stacks with x86-64 code only"
#endif

struct Barrier {
  unsigned expected = 0, arrived = 0;
  uint64_t generation = 0;
};

struct Fiber {
  void* sp = nullptr;
  bool done = false;
  const Barrier* waiting = nullptr;
  uint64_t wait_generation = 0;
};

struct Block {
  unsigned threads = 0, finished = 0;
  Barrier all;
  std::vector<Barrier> warps;
  std::vector<uint64_t> lanes[2];  // one slot per thread for shuffles, by warp barrier parity
  std::vector<int> mma;            // six words per thread: an emulated mma's fragments
  struct AsyncCopy {
    void* dst;
    const void* src;
    int group;  // -1 until committed
  };
  std::vector<std::vector<AsyncCopy>> async;  // per thread: its cp.async copies not yet made
  std::vector<int> async_groups;              // per thread: the groups it has committed
  std::vector<Fiber> fibers;
  unsigned running = 0;         // the fiber being run
  unsigned at = 0;              // its place in `order`
  std::vector<unsigned> order;  // the threads in the order they take turns (Schedule below)
  void* scheduler_sp = nullptr;
  std::function<void()> body;  // one thread's kernel call for the current block
};
inline thread_local Block* current = nullptr;  // (per OS thread: host-run may drain streams on several)

// Stacks for the fibers, kept between launches (kStackBytes each: the kernels' locals).
constexpr size_t kStackBytes = size_t{256} << 10;
inline std::vector<std::unique_ptr<unsigned char[]>>& stacks() {
  static thread_local std::vector<std::unique_ptr<unsigned char[]>> s;
  return s;
}

// The order in which a block's threads take turns, and the grid's blocks run
// (TROUPE_EMU_ORDER): `forward` (thread and block 0 first), `reverse` (the last first), or
// `shuffle` (a new random order for every block, seeded by TROUPE_EMU_SEED, default 1).
// A GPU promises no order, so a kernel's results must not depend on it; a missing
// __syncthreads or __syncwarp between one thread's write and another's read of shared
// memory, or a grid's "last block" logic that assumes which block finishes last, gives
// other results in another order, which the bit-for-bit tests then catch (ctest runs the
// emulation tests in all three).
enum class Schedule { kForward, kReverse, kShuffle };
inline Schedule schedule() {
  static const Schedule s = [] {
    const char* e = std::getenv("TROUPE_EMU_ORDER");
    const std::string v = e ? e : "forward";
    if (v == "forward") return Schedule::kForward;
    if (v == "reverse") return Schedule::kReverse;
    if (v == "shuffle") return Schedule::kShuffle;
    std::fprintf(stderr, "cuda emulation: TROUPE_EMU_ORDER=%s is not forward, reverse or shuffle\n", v.c_str());
    std::abort();
  }();
  return s;
}
// A small deterministic generator for the shuffled orders (the same run, the same orders).
inline uint64_t next_random() {
  static thread_local uint64_t state = [] {
    const char* e = std::getenv("TROUPE_EMU_SEED");
    return e ? std::strtoull(e, nullptr, 10) : uint64_t{1};
  }();
  state += 0x9E3779B97F4A7C15ull;  // splitmix64
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// 0 .. n-1 in the schedule's order.
inline std::vector<unsigned> schedule_order(unsigned n) {
  std::vector<unsigned> o(n);
  for (unsigned i = 0; i < n; ++i) o[i] = schedule() == Schedule::kReverse ? n - 1 - i : i;
  if (schedule() == Schedule::kShuffle)
    for (unsigned i = n; i > 1; --i) std::swap(o[i - 1], o[next_random() % i]);
  return o;
}

// Leaves the running fiber (its context saved in *save) for the next one that can run, in
// the block's order, or for the scheduler when none can (the block is done, or deadlocked).
inline void switch_to_next(Block& blk, void** save) {
  for (unsigned k = 1; k <= blk.threads; ++k) {
    const unsigned at = (blk.at + k) % blk.threads, t = blk.order[at];
    Fiber& f = blk.fibers[t];
    if (f.done || (f.waiting && f.waiting->generation == f.wait_generation)) continue;
    f.waiting = nullptr;
    blk.running = t;
    blk.at = at;
    threadIdx.x = t;
    troupe_emu_switch(save, f.sp);
    return;
  }
  troupe_emu_switch(save, blk.scheduler_sp);
}

[[noreturn]] inline void fiber_entry() {
  Block& b = *current;
  b.body();
  b.fibers[b.running].done = true;
  ++b.finished;
  void* dead = nullptr;
  switch_to_next(b, &dead);
  __builtin_unreachable();
}

// A fresh context on stack `i` that starts in fiber_entry.
inline void* fresh_context(unsigned i) {
  unsigned char* top = stacks()[i].get() + kStackBytes;
  auto* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t{15});
  *--sp = 0;                                         // (fiber_entry's frame then starts 8 mod 16, as after a call)
  *--sp = reinterpret_cast<uint64_t>(&fiber_entry);  // troupe_emu_switch's ret
  for (int r = 0; r < 6; ++r) *--sp = 0;             // rbp, rbx, r12 .. r15
  return sp;
}

// Inside a fiber: wait until all of b's threads have arrived.
inline void wait(Barrier& b) {
  const uint64_t g = b.generation;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  Block& blk = *current;
  Fiber& f = blk.fibers[blk.running];
  f.waiting = &b;
  f.wait_generation = g;
  switch_to_next(blk, &f.sp);
}

// One block: every thread runs `body` (blockIdx already set) to its end.
inline void run_block(Block& blk, unsigned block) {
  for (unsigned t = 0; t < block; ++t) blk.fibers[t] = Fiber{fresh_context(t)};
  blk.async.assign(block, {});  // (copies a thread never waited for are dropped with its block)
  blk.async_groups.assign(block, 0);
  blk.all = Barrier{block};
  for (auto& w : blk.warps) w = Barrier{32};
  blk.finished = 0;
  blk.order = schedule_order(block);
  blk.at = 0;
  blk.running = blk.order[0];
  threadIdx.x = blk.running;
  troupe_emu_switch(&blk.scheduler_sp, blk.fibers[blk.running].sp);
  if (blk.finished != block) {
    std::fprintf(stderr,
                 "cuda emulation: deadlock in block (%u, %u, %u): %u threads wait at barriers never completed\n",
                 blockIdx.x, blockIdx.y, blockIdx.z, block - blk.finished);
    std::abort();
  }
}

// A gx x gy x gz grid of blocks of `block` threads (whole warps), one block at a time (so
// shared statics are never used by two blocks at once), on the calling thread.
template <typename Kernel, typename... Args>
void launch3(unsigned gx, unsigned gy, unsigned gz, unsigned block, Kernel kernel, Args... args) {
  Block blk;
  blk.threads = block;
  blk.warps.resize(block / 32);
  blk.lanes[0].assign(block, 0);
  blk.lanes[1].assign(block, 0);
  blk.mma.assign(size_t{block} * 6, 0);
  blk.fibers.resize(block);
  while (stacks().size() < block)  // (not zeroed: pages are touched only as deep as a kernel goes)
    stacks().push_back(std::unique_ptr<unsigned char[]>(new unsigned char[kStackBytes]));
  blk.body = [&] { kernel(args...); };
  Block* outer = current;
  current = &blk;
  blockDim = {block, 1, 1};
  gridDim = {gx, gy, gz};
  threadIdx = {0, 0, 0};
  const uint64_t blocks = uint64_t{gx} * gy * gz;
  std::vector<unsigned> grid_order;  // (forward needs none; the others: up to 2^32 blocks)
  if (schedule() != Schedule::kForward) grid_order = schedule_order(static_cast<unsigned>(blocks));
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint64_t b = grid_order.empty() ? i : grid_order[i];
    blockIdx = {static_cast<unsigned>(b % gx), static_cast<unsigned>(b / gx % gy), static_cast<unsigned>(b / gx / gy)};
    run_block(blk, block);
  }
  current = outer;
}
template <typename Kernel, typename... Args>
void launch(unsigned grid, unsigned block, Kernel kernel, Args... args) {
  launch3(grid, 1, 1, block, kernel, args...);
}

// Device memory as cudaMalloc gives it: 256-byte aligned (a plain std::vector's data is
// 16-byte aligned, which the WMMA and UBSan alignment checks would rightly refuse where a
// kernel relies on cudaMalloc's alignment).
template <typename T>
struct DeviceAllocator {
  using value_type = T;
  DeviceAllocator() = default;
  template <typename U>
  DeviceAllocator(const DeviceAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{256})); }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{256}); }
  template <typename U>
  bool operator==(const DeviceAllocator<U>&) const {
    return true;
  }
};
template <typename T>
using device_vector = std::vector<T, DeviceAllocator<T>>;

}  // namespace cuda_emu

inline void __syncthreads() { cuda_emu::wait(cuda_emu::current->all); }

namespace cuda_emu {
// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 over the warp, with PTX's fragment layout
// (g = lane / 4, q = lane % 4): a = {A[g][4q..], A[g+8][4q..], A[g][16+4q..], A[g+8][16+4q..]},
// b = {B[4q..][g], B[16+4q..][g]} (4 signed bytes each, the lowest first), d = {D[g][2q],
// D[g][2q+1], D[g+8][2q], D[g+8][2q+1]}, D += A B exactly. Every lane of the warp calls it.
inline void mma_s8_16x8x32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
  auto& blk = *current;
  const unsigned me = threadIdx.x, warp = me / 32, lane = me % 32;
  int* mine = &blk.mma[me * 6];
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  wait(blk.warps[warp]);
  const int* w = &blk.mma[warp * 32 * 6];
  auto byte = [](int word, int k) {
    return static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(word) >> (8 * k)));
  };
  auto A = [&](int r, int k) {
    return byte(w[((r % 8) * 4 + (k % 16) / 4) * 6 + (r >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0)], k % 4);
  };
  auto B = [&](int k, int c) { return byte(w[(c * 4 + (k % 16) / 4) * 6 + 4 + (k >= 16 ? 1 : 0)], k % 4); };
  const int g = static_cast<int>(lane / 4), q = static_cast<int>(lane % 4);
  int out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), c = 2 * q + (e & 1);
    int sum = d[e];
    for (int k = 0; k < 32; ++k) sum += A(r, k) * B(k, c);
    out[e] = sum;
  }
  wait(blk.warps[warp]);  // (every lane has read the fragments before any writes its next)
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
}  // namespace cuda_emu

template <typename T>
T __shfl_xor_sync(unsigned /*mask: full warps only*/, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  auto& blk = *cuda_emu::current;
  const unsigned me = threadIdx.x, warp = me / 32,
                 partner = (me & ~31u) | ((me & 31u) ^ static_cast<unsigned>(lane_mask));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  // (slots alternate with the warp barrier's generation: a lane that has read may write
  // its next value before the others have read this one; one barrier per exchange)
  auto& lanes = blk.lanes[blk.warps[warp].generation & 1];
  lanes[me] = bits;
  cuda_emu::wait(blk.warps[warp]);
  const uint64_t theirs = lanes[partner];
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
  auto& lanes = blk.lanes[blk.warps[warp].generation & 1];  // (as in __shfl_xor_sync)
  lanes[me] = bits;
  cuda_emu::wait(blk.warps[warp]);
  const uint64_t theirs = lanes[(me & ~31u) | (static_cast<unsigned>(src) & 31u)];
  T out;
  std::memcpy(&out, &theirs, sizeof(T));
  return out;
}

template <typename T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
template <typename T>
T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Rounding intrinsics: one IEEE operation each (the host compiler may not contract them;
// nvcc's contraction of plain expressions is therefore not reproduced here).
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }  // half to even
// Four signed 8-bit products summed into c.
inline int __dp4a(int a, int b, int c) {
  for (int k = 0; k < 4; ++k)
    c += static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * k))) *
         static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * k)));
  return c;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }  // (CUDA's is within 2 ulp of this)
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) { cuda_emu::wait(cuda_emu::current->warps[threadIdx.x / 32]); }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<uint32_t>(x)) + 1; }
template <typename T>
T __ldcs(const T* p) {  // a streaming load: a plain load here
  return *p;
}
template <typename T>
T __ldcg(const T* p) {  // a load that bypasses L1: a plain load here
  return *p;
}
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline float __int_as_float(int32_t i) { return std::bit_cast<float>(i); }
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
// CUDA's rule for every WMMA load and store: the tile's pointer 256-bit (32-byte) aligned,
// ldm a multiple of 16 bytes (8 f16/bf16 elements, 4 floats). A GPU may fault or read the
// wrong bytes otherwise; here it is reported, then abort().
inline void wmma_check(const void* p, unsigned ldm, size_t elem_bytes, const char* what) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % 32 != 0 || (ldm * elem_bytes) % 16 != 0) {
    std::fprintf(stderr,
                 "cuda_emulation: %s with a %s pointer (%p, %zu bytes past 32-byte alignment) and ldm %u "
                 "(%zu bytes; must be a multiple of 16): thread %u of block (%u, %u, %u)\n",
                 what, addr % 32 != 0 ? "misaligned" : "32-byte aligned", p, static_cast<size_t>(addr % 32), ldm,
                 static_cast<size_t>(ldm) * elem_bytes, threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
    std::abort();
  }
}
inline float emu_load(const __half* p) { return __half2float(*p); }
inline float emu_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
inline float emu_load(const float* p) { return *p; }
template <typename U, typename T, typename L, typename P>
void load_matrix_sync(fragment<U, 16, 16, 16, T, L>& f, const P* p, unsigned ldm) {
  static_assert(std::is_same_v<std::remove_cv_t<P>, T>, "the pointer's type is the fragment's");
  wmma_check(p, ldm, sizeof(P), "wmma::load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.at(r, c) = emu_load(std::is_same_v<L, col_major> ? p + c * ldm + r : p + r * ldm + c);
}
template <typename T>
void load_matrix_sync(fragment<accumulator, 16, 16, 16, T, void>& f, const float* p, unsigned ldm, layout_t l) {
  wmma_check(p, ldm, sizeof(float), "wmma::load_matrix_sync (accumulator)");
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
  wmma_check(p, ldm, sizeof(float), "wmma::store_matrix_sync");
  if ((threadIdx.x & 31) != 0) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (l == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.at(r, c);
}
}  // namespace nvcuda::wmma

// The warp-level matrix instructions flash-attention kernels use (attention_mma.cu), with
// PTX's fragment layouts (g = lane / 4, q = lane % 4; a 32-bit register holds two halves,
// the lower column first).
namespace cuda_emu {
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: a = {A[g][2q..], A[g+8][2q..],
// A[g][8+2q..], A[g+8][8+2q..]}, b = {B[2q..][g], B[8+2q..][g]}, d = {D[g][2q], D[g][2q+1],
// D[g+8][2q], D[g+8][2q+1]}, D += A B (the products exact, summed in double and rounded
// once: the tensor cores' own order is unspecified). Every lane of the warp calls it.
inline void mma_f16_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  auto& blk = *current;
  const unsigned me = threadIdx.x, warp = me / 32, lane = me % 32;
  int* mine = &blk.mma[me * 6];
  for (int i = 0; i < 4; ++i) mine[i] = static_cast<int>(a[i]);
  mine[4] = static_cast<int>(b0);
  mine[5] = static_cast<int>(b1);
  wait(blk.warps[warp]);
  const int* w = &blk.mma[warp * 32 * 6];
  auto half = [](int word, int k) {
    const uint16_t bits = static_cast<uint16_t>(static_cast<uint32_t>(word) >> (16 * (k & 1)));
    return static_cast<double>(__half2float(std::bit_cast<__half>(bits)));
  };
  auto A = [&](int r, int k) {
    return half(w[((r % 8) * 4 + (k % 8) / 2) * 6 + (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k);
  };
  auto B = [&](int k, int c) { return half(w[(c * 4 + (k % 8) / 2) * 6 + 4 + (k >= 8 ? 1 : 0)], k); };
  const int g = static_cast<int>(lane / 4), q = static_cast<int>(lane % 4);
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), c = 2 * q + (e & 1);
    double sum = d[e];
    for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, c);
    out[e] = static_cast<float>(sum);
  }
  wait(blk.warps[warp]);  // (every lane has read the fragments before any writes its next)
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i .. 8i + 7 give the addresses of
// matrix i's eight rows (16 bytes each, 16-byte aligned); lane l receives in r[i] the halves
// (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1) of matrix i, or with trans (rows 2 (l % 4)
// and 2 (l % 4) + 1, column l / 4). Every lane of the warp calls it.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    std::fprintf(
        stderr, "cuda_emulation: ldmatrix with a row address %p not 16-byte aligned: thread %u of block (%u, %u, %u)\n",
        row, threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
    std::abort();
  }
  const unsigned lane = threadIdx.x % 32;
  for (int i = 0; i < 4; ++i) {
    auto at = [&](unsigned src_row) {
      return static_cast<const uint16_t*>(__shfl_sync(0xffffffffu, row, static_cast<int>(8 * i + src_row)));
    };
    uint16_t lo, hi;
    if (trans) {
      const uint16_t* r0 = at(2 * (lane % 4));
      const uint16_t* r1 = at(2 * (lane % 4) + 1);
      lo = r0[lane / 4];
      hi = r1[lane / 4];
    } else {
      const uint16_t* p = at(lane / 4);
      lo = p[2 * (lane % 4)];
      hi = p[2 * (lane % 4) + 1];
    }
    r[i] = uint32_t{lo} | uint32_t{hi} << 16;
  }
}

// cp.async.cg.shared.global (16 bytes; src_bytes 0: the destination zero-filled) and its
// groups. A GPU may make the copy at any time between the instruction and the wait for its
// group; here it is made at the latest (forward order), at once (reverse order) or either
// at random (shuffle). So a kernel that reads the destination before its
// cp.async.wait_group (and the barrier after it) reads the old bytes in one order, and one
// that issues a copy into a buffer another warp still reads (a barrier missing before the
// copy) clobbers it in another, and the tests' bits or values differ.
inline void cp_async16(void* dst, const void* src, bool zero_fill) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || (!zero_fill && reinterpret_cast<uintptr_t>(src) % 16 != 0)) {
    std::fprintf(stderr,
                 "cuda_emulation: cp.async of 16 bytes from %p to %p, not both 16-byte aligned: thread %u of block "
                 "(%u, %u, %u)\n",
                 src, dst, threadIdx.x, blockIdx.x, blockIdx.y, blockIdx.z);
    std::abort();
  }
  const bool now = schedule() == Schedule::kReverse || (schedule() == Schedule::kShuffle && (next_random() & 1));
  if (now && zero_fill)
    std::memset(dst, 0, 16);
  else if (now)
    std::memcpy(dst, src, 16);
  else
    current->async[threadIdx.x].push_back({dst, zero_fill ? nullptr : src, -1});
}
inline void cp_async_commit() {
  int& n = current->async_groups[threadIdx.x];
  for (auto& c : current->async[threadIdx.x])
    if (c.group < 0) c.group = n;
  ++n;
}
// Makes this thread's copies of every committed group but the newest `pending`.
inline void cp_async_wait(int pending) {
  auto& v = current->async[threadIdx.x];
  const int done_below = current->async_groups[threadIdx.x] - pending;
  size_t keep = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].group >= 0 && v[i].group < done_below) {
      if (v[i].src)
        std::memcpy(v[i].dst, v[i].src, 16);
      else
        std::memset(v[i].dst, 0, 16);
    } else {
      v[keep++] = v[i];
    }
  }
  v.resize(keep);
}
}  // namespace cuda_emu
