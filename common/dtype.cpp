#include "common/dtype.h"

#include <array>
#include <cctype>
#include <string>

namespace troupe {
namespace {
struct Entry {
  DType type;
  DTypeTraits traits;
};
constexpr std::array<Entry, 13> kTypes{{
    {DType::F32, {"f32", 1, 4, false}},
    {DType::F16, {"f16", 1, 2, false}},
    {DType::Q4_0, {"q4_0", 32, 18, true}},
    {DType::Q4_1, {"q4_1", 32, 20, true}},
    {DType::Q5_0, {"q5_0", 32, 22, true}},
    {DType::Q5_1, {"q5_1", 32, 24, true}},
    {DType::Q8_0, {"q8_0", 32, 34, true}},
    {DType::Q8_1, {"q8_1", 32, 36, true}},
    {DType::Q4_K, {"q4_k", 256, 144, true}},
    {DType::Q5_K, {"q5_k", 256, 176, true}},
    {DType::Q6_K, {"q6_k", 256, 210, true}},
    {DType::Q8_K, {"q8_k", 256, 292, true}},
    {DType::BF16, {"bf16", 1, 2, false}},
}};
}  // namespace

std::optional<DType> dtype_from_ggml(uint32_t id) {
  for (const auto& e : kTypes)
    if (static_cast<uint32_t>(e.type) == id) return e.type;
  return std::nullopt;
}

const DTypeTraits& dtype_traits(DType t) {
  for (const auto& e : kTypes)
    if (e.type == t) return e.traits;
  static const DTypeTraits unknown{"unknown", 1, 0, false};
  return unknown;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& e : kTypes)
    if (e.traits.name == lower) return e.type;
  return std::nullopt;
}

std::optional<size_t> row_bytes(DType t, uint64_t n) {
  const auto& tr = dtype_traits(t);
  if (tr.type_size == 0 || n % tr.block_size != 0) return std::nullopt;
  return static_cast<size_t>(n / tr.block_size * tr.type_size);
}

}  // namespace troupe
