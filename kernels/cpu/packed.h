// Weight and activation layouts used by the CPU matmul kernels.
//
// RQ ("repacked quant"): every 32-element block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and
// the sub-blocks of Q4_K/Q5_K are rewritten at load time as unsigned integers u with a
// per-block scale d and offset m, so that w = d * u + m. Blocks go in pairs (A, B):
//   8 bytes: f16 dA, dB, mA, mB
//   RQ4: 32 bytes, byte j = uA[j] | uB[j] << 4      (4-bit types: same bytes as GGUF)
//   RQ8: 64 bytes, uA[0..31] then uB[0..31]          (5- and 8-bit types)
// A SIMD kernel then expands one pair into 64 unsigned bytes in element order and takes
// a u8 x s8 dot product with the int8-quantized activations. Q6_K keeps its GGUF layout
// (16-element sub-scales) and is multiplied against Q8_K activations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "common/result.h"

namespace troupe::cpu {

enum class PackKind : uint8_t { RQ4, RQ8, Q6K, F32, F16, BF16 };

// How a kernel reads RQ pairs: 4-bit, bytes below 128 (5-bit types), or full bytes (Q8_0).
enum class RqLayout : uint8_t { Four, EightSmall, Eight };

struct AlignedBytes {
  std::unique_ptr<uint8_t, void (*)(void*)> ptr{nullptr, [](void*) {}};
  size_t size = 0;
  static AlignedBytes allocate(size_t bytes);
};

// A weight matrix [rows, cols] (y = W x), ready for the CPU kernels.
struct PackedWeight {
  DType source_type = DType::F32;
  PackKind kind = PackKind::F32;
  int64_t rows = 0, cols = 0;
  int64_t num_pairs = 0;  // RQ: ceil(cols / 64)
  RqLayout rq_layout = RqLayout::Four;
  size_t row_stride = 0;          // bytes between rows
  const uint8_t* data = nullptr;  // may point into a memory map (float and Q6_K kinds)
  AlignedBytes owned;             // storage when repacked
};

constexpr size_t kRQ4PairBytes = 8 + 32;
constexpr size_t kRQ8PairBytes = 8 + 64;

// Packs `rows` rows of `cols` elements of GGUF `type` from `src` (row-major, GGUF layout).
// `src` must stay alive when the result points into it (float kinds and Q6_K).
Result<PackedWeight> pack_weight(DType type, int64_t rows, int64_t cols, const void* src);
// Packs several matrices with the same type and cols into one (rows concatenated), used
// to fuse Q/K/V and gate/up projections into one matmul. Always copies.
Result<PackedWeight> pack_concat(DType type, int64_t cols, const std::vector<std::pair<const void*, int64_t>>& parts);

// Dequantizes row r of a packed weight (reference path; used by embedding lookups and tests).
void unpack_row(const PackedWeight& w, int64_t r, float* out);

// int8 activations for RQ weights, one token: q[num_pairs * 64], scales[num_pairs * 4]
// holding (dA, dB, sA, sB) per pair where s = d * sum(q of the block).
struct ActQ {
  int64_t num_pairs = 0;
  std::vector<int8_t> q;      // [num_tokens, num_pairs * 64]
  std::vector<float> scales;  // [num_tokens, num_pairs * 4]
};
struct ActQuantMode {
  bool d_as_f16 = true;  // GGML q8_0 / q8_1 keep d in f16 (the 32-block types)
  bool s_as_f16 = true;  // GGML q8_1 keeps s in f16 (Q4_1, Q5_1); others need an exact s
  static ActQuantMode for_weight(DType t) {
    const bool block32 =
        t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0;
    return {block32, t == DType::Q4_1 || t == DType::Q5_1};
  }
};
void quantize_activations(const float* x, int64_t cols, ActQ& out, int64_t t0, int64_t t1, const ActQuantMode& mode);
// The same for rows t0..t1 of x, written to rows out_t0.. of out.
void quantize_activations_into(const float* x, int64_t cols, ActQ& out, int64_t t0, int64_t t1, int64_t out_t0,
                               const ActQuantMode& mode);

}  // namespace troupe::cpu
