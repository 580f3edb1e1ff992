// Tensor element types. Numeric values are GGML's type ids, so a GGUF tensor's type field
// maps onto this enum after a range check (dtype_from_ggml).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,  // activation-side type (int8 blocks with a precomputed sum)
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,  // activation-side type for the K-quants
  BF16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
  bool is_quantized;
};

// nullopt for ids we do not support (GGUF files may carry others).
std::optional<DType> dtype_from_ggml(uint32_t id);
const DTypeTraits& dtype_traits(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // "q4_1", "bf16", ...

// Bytes of one row of `n` elements, or nullopt when n is not a multiple of the block.
std::optional<size_t> row_bytes(DType t, uint64_t n);

}  // namespace troupe
