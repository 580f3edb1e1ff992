// How the CUDA backend lays out weight rows on the device (make_weight; the tests that run
// kernel source on the CPU build their rows with the same functions). Plain C++.
//
// Float rows are padded with zeros to 32 columns. The 32-value block types Q4_0, Q4_1,
// Q5_0, Q5_1 and Q8_0 are kept *split*: a row holds all its blocks' quants first (16 bytes a
// block, 32 for Q8_0), then their high bits (Q5_0, Q5_1: 4 bytes a block), then their
// scales (d, or d and m: 2 or 4 bytes a block) -- the GGUF row's bytes in another order,
// the row stride rounded up to 16 bytes. A warp whose 32 lanes take a block each then loads
// 512 contiguous bytes of quants with 16-byte loads and 64-128 contiguous bytes of scales,
// where the GGUF order (blocks of 18-34 bytes) needs 4-byte or 2-byte loads at the block
// stride, each load instruction touching 5-9 cache lines for 128 bytes used. The K-quants'
// super-blocks (144-210 bytes) stay as in the file.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>

#include "kernels/dtype.h"

namespace troupe::cuda {

// Bytes a block puts in each section of a split row (high: 0 when there is none), and
// where in the GGUF block each part starts.
struct SplitBlock {
  int quant = 0, high = 0, scale = 0;
  int quant_at = 0, high_at = 0;  // (the scales open every GGUF block: d, then m)
};
inline std::optional<SplitBlock> split_block(DType type) {
  switch (type) {
    case DType::Q4_0: return SplitBlock{16, 0, 2, 2, 0};
    case DType::Q4_1: return SplitBlock{16, 0, 4, 4, 0};
    case DType::Q5_0: return SplitBlock{16, 4, 2, 6, 2};
    case DType::Q5_1: return SplitBlock{16, 4, 4, 8, 4};
    case DType::Q8_0: return SplitBlock{32, 0, 2, 2, 0};
    default: return std::nullopt;
  }
}

inline bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// The device's row stride for `cols` columns of `type` (nullopt: not a whole number of blocks).
inline std::optional<size_t> device_row_bytes(DType type, int64_t cols) {
  if (cols <= 0) return std::nullopt;
  const int64_t padded = is_float_type(type) ? (cols + 31) / 32 * 32 : cols;
  const auto rb = row_bytes(type, static_cast<uint64_t>(padded));
  if (!rb || (!is_float_type(type) && !row_bytes(type, static_cast<uint64_t>(cols)))) return std::nullopt;
  return split_block(type) ? (*rb + 15) / 16 * 16 : *rb;
}

// One GGUF row of `cols` columns -> the device row at dst (device_row_bytes(type, cols)
// bytes; what the data does not fill is zero).
inline void to_device_row(DType type, const uint8_t* src, int64_t cols, uint8_t* dst) {
  const size_t src_rb = *row_bytes(type, static_cast<uint64_t>(cols));
  const size_t dst_rb = *device_row_bytes(type, cols);
  std::memset(dst, 0, dst_rb);
  const auto sb = split_block(type);
  if (!sb) {
    std::memcpy(dst, src, src_rb);
    return;
  }
  const int64_t nb = cols / 32;
  const size_t bb = src_rb / static_cast<size_t>(nb);
  uint8_t* quants = dst;
  uint8_t* highs = dst + sb->quant * nb;
  uint8_t* scales = highs + sb->high * nb;
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* b = src + bb * j;
    std::memcpy(quants + sb->quant * j, b + sb->quant_at, sb->quant);
    if (sb->high) std::memcpy(highs + sb->high * j, b + sb->high_at, sb->high);
    std::memcpy(scales + sb->scale * j, b, sb->scale);
  }
}

}  // namespace troupe::cuda
