// y[t, r] = sum_k W[r, k] * x[t, k] for every packed weight kind, with runtime ISA dispatch.
//
// Batch independence: a (token, row) result is computed by the same sequence of
// operations whatever the number of tokens in the call or the tile it lands in.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant_blocks.h"

namespace troupe::cpu {

enum class Isa { Scalar, Avx2, Avx512 };
Isa detect_isa();  // the best the CPU supports, capped by env TROUPE_CPU_ISA
const char* isa_name(Isa isa);

// Kernels for rows [r0, r1) and nt <= kMaxTile tokens.
constexpr int kMaxTile = 4;
// matmul() calls of at most this many tokens take MatmulKernels::rq_stream.
constexpr int64_t kStreamTokens = 16;
constexpr int kMaxStreamTile = 8;
struct MatmulKernels {
  void (*rq)(RqLayout layout, const uint8_t* w, size_t row_stride, int64_t num_pairs, const int8_t* xq, const float* xs,
             int nt, int64_t r0, int64_t r1, float* y, int64_t ldy);
  // The same results as rq (bit for bit), by the kernel that streams weights best: for
  // matmuls of a few tokens, whose weights come from memory rather than the cache.
  void (*rq_stream)(RqLayout layout, const uint8_t* w, size_t row_stride, int64_t num_pairs, const int8_t* xq,
                    const float* xs, int nt, int64_t r0, int64_t r1, float* y, int64_t ldy);
  int rq_stream_tile;  // the most tokens rq_stream takes at once (kMaxTile or kMaxStreamTile)
  void (*q6k)(const uint8_t* w, size_t row_stride, int64_t num_blocks, const BlockQ8_K* x, int nt, int64_t r0,
              int64_t r1, float* y, int64_t ldy);
  void (*flt)(PackKind kind, const uint8_t* w, size_t row_stride, int64_t cols, const float* x, int nt, int64_t r0,
              int64_t r1, float* y, int64_t ldy);
};
const MatmulKernels& kernels_for(Isa isa);

// Per-thread scratch for the SIMD kernels, at least `bytes` long, 64-byte aligned, valid
// until the thread's next call (slot 0..3: independent buffers). Defined in the baseline
// matmul.cpp so that no std::vector code is instantiated under AVX flags in the kernel
// files (the linker could pick such a copy for code that must run on any x86-64).
void* thread_scratch(int slot, size_t bytes);

struct MatmulScratch {
  ActQ act;
  std::vector<BlockQ8_K> act_k;
  std::vector<int64_t> group_tokens, group_chunks;  // matmul_group's prefix sums
};

// x: [n_tokens, w.cols], y: [n_tokens, w.rows].
void matmul(const PackedWeight& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, MatmulScratch& scratch,
            Isa isa);

// Several independent matmuls in one pass over the pool (a MoE layer's experts, each over
// its own few rows): one region quantizes every job's activations, one hands out (job, row
// chunk) tasks. Each (token, row) result has the bits matmul() gives it. y rows are ldy apart.
struct GroupJob {
  const PackedWeight* w = nullptr;
  const float* x = nullptr;
  int64_t n = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};
// Whether matmul_group takes these jobs (integer-dot kinds, one column count and source type).
bool can_group(const GroupJob* jobs, int64_t count);
void matmul_group(const GroupJob* jobs, int64_t count, ThreadPool& pool, MatmulScratch& scratch, Isa isa);

}  // namespace troupe::cpu
