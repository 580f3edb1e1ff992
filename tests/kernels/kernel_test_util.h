// Random inputs for kernel differential tests.
#pragma once
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/quant_ref.h"
#include "kernels/cuda/layout.h"
#include "common/dtype.h"
#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"

namespace troupe::test {

// A [rows, cols] matrix of `type` in GGUF layout. 32-block types and floats are quantized
// from random floats with the reference quantizer; K-quants are random blocks with sane scales.
inline std::vector<uint8_t> random_weight(DType type, int64_t rows, int64_t cols, std::mt19937& rng,
                                          bool structured = false, float scale = 1.0f) {
  const size_t rb = *row_bytes(type, static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  if (type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K) {
    for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
    const size_t bs = dtype_traits(type).type_size;
    for (size_t off = 0; off < out.size(); off += bs) {
      const uint16_t d = f32_to_f16(scale * (0.001f + 0.01f * std::fabs(nd(rng))));
      const uint16_t dm = f32_to_f16(scale * (0.001f + 0.01f * std::fabs(nd(rng))));
      if (type == DType::Q6_K) {
        std::memcpy(out.data() + off + 208, &d, 2);
      } else {
        std::memcpy(out.data() + off, &d, 2);
        std::memcpy(out.data() + off + 2, &dm, 2);
      }
    }
    return out;
  }
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j)
      row[j] = scale * (structured ? static_cast<float>(((r * 7 + j * 3) % 17) - 8) * 0.125f : nd(rng));
    cpu::quantize_row_ref(type, row.data(), out.data() + rb * r, cols);
  }
  return out;
}

// A GGUF matrix's rows in the CUDA backend's device layout (kernels/cuda/layout.h: floats
// padded to 32 columns, the 32-value block types and Q6_K split); the row stride in *stride.
inline std::vector<uint8_t> device_rows(DType type, const std::vector<uint8_t>& gguf, int64_t rows, int64_t cols,
                                        size_t* stride) {
  const size_t src_rb = *row_bytes(type, static_cast<uint64_t>(cols));
  *stride = *cuda::device_row_bytes(type, cols);
  std::vector<uint8_t> out(*stride * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    cuda::to_device_row(type, gguf.data() + src_rb * r, cols, out.data() + *stride * r);
  return out;
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace troupe::test
