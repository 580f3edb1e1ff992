// How the CUDA backend lays out weight rows on the device (make_weight; the tests that run
// kernel source on the CPU build their rows with the same functions). Plain C++.
//
// Float rows are padded with zeros to 32 columns. The 32-value block types Q4_0, Q4_1,
// Q5_0, Q5_1 and Q8_0 are kept *split*: a row holds all its blocks' quants first (16 bytes a
// block; Q8_0's first 16, then its last 16), then their high bits (Q5_0, Q5_1: 4 bytes a block), then their
// scales (d, or d and m: 2 or 4 bytes a block) -- the GGUF row's bytes in another order,
// the row stride rounded up to 16 bytes. A warp whose 32 lanes take a block each then loads
// 512 contiguous bytes of quants with 16-byte loads and 64-128 contiguous bytes of scales,
// where the GGUF order (blocks of 18-34 bytes) needs 4-byte or 2-byte loads at the block
// stride, each load instruction touching 5-9 cache lines for 128 bytes used. Q6_K's
// 210-byte super-blocks (only 2-byte aligned in the file) are split the same way: the 192
// bytes of low and high quant bits, then the 16 scale bytes, then d; Q4_K's and Q5_K's
// (144, 176 bytes) stay as in the file, already 16-byte aligned.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>

#include "common/dtype.h"

namespace troupe::cuda {

// The sections of a split row, in device order: each block's `bytes` bytes from offset
// `at` of its GGUF block go to section s at block index * bytes.
struct Section {
  int bytes = 0, at = 0;
};
struct SplitLayout {
  int count = 0;
  Section s[3];
  // Where section i starts in a device row of nb blocks.
  int64_t offset(int i, int64_t nb) const {
    int64_t o = 0;
    for (int k = 0; k < i; ++k) o += s[k].bytes * nb;
    return o;
  }
};
inline std::optional<SplitLayout> split_layout(DType type) {
  switch (type) {  // quants, (high bits,) scales
    case DType::Q4_0:
      return SplitLayout{2, {{16, 2}, {2, 0}}};
    case DType::Q4_1:
      return SplitLayout{2, {{16, 4}, {4, 0}}};
    case DType::Q5_0:
      return SplitLayout{3, {{16, 6}, {4, 2}, {2, 0}}};
    case DType::Q5_1:
      return SplitLayout{3, {{16, 8}, {4, 4}, {4, 0}}};
    case DType::Q8_0:
      return SplitLayout{3, {{16, 2}, {16, 18}, {2, 0}}};  // first and last 16 quants, d
    case DType::Q6_K:
      return SplitLayout{3, {{192, 0}, {16, 192}, {2, 208}}};  // ql and qh, scales, d
    default:
      return std::nullopt;
  }
}

inline bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// The device's row stride for `cols` columns of `type` (nullopt: not a whole number of blocks).
inline std::optional<size_t> device_row_bytes(DType type, int64_t cols) {
  if (cols <= 0) return std::nullopt;
  const int64_t padded = is_float_type(type) ? (cols + 31) / 32 * 32 : cols;
  const auto rb = row_bytes(type, static_cast<uint64_t>(padded));
  if (!rb || (!is_float_type(type) && !row_bytes(type, static_cast<uint64_t>(cols)))) return std::nullopt;
  return split_layout(type) ? (*rb + 15) / 16 * 16 : *rb;
}

// One GGUF row of `cols` columns -> the device row at dst (device_row_bytes(type, cols)
// bytes; what the data does not fill is zero).
inline void to_device_row(DType type, const uint8_t* src, int64_t cols, uint8_t* dst) {
  const size_t src_rb = *row_bytes(type, static_cast<uint64_t>(cols));
  const size_t dst_rb = *device_row_bytes(type, cols);
  std::memset(dst, 0, dst_rb);
  const auto sl = split_layout(type);
  if (!sl) {
    std::memcpy(dst, src, src_rb);
    return;
  }
  const size_t bb = dtype_traits(type).type_size;
  const int64_t nb = static_cast<int64_t>(src_rb / bb);
  for (int i = 0; i < sl->count; ++i) {
    const Section& sec = sl->s[i];
    uint8_t* out = dst + sl->offset(i, nb);
    for (int64_t j = 0; j < nb; ++j) std::memcpy(out + sec.bytes * j, src + bb * j + sec.at, sec.bytes);
  }
}

}  // namespace troupe::cuda
