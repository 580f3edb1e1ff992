// The reference quantizers and dequantizers: round trips within each type's resolution,
// and hand-checked blocks.
#include <catch2/catch.hpp>

#include "tests/kernels/kernel_test_util.h"

using namespace troupe;

TEST_CASE("f16 and bf16 conversions are exact where representable", "[kernels][quant]") {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f})
    REQUIRE(f16_to_f32(f32_to_f16(f)) == f);
  REQUIRE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  REQUIRE(bf16_to_f32(f32_to_bf16(1.5f)) == 1.5f);
  REQUIRE(f32_to_f16(1.0f) == 0x3c00);
  REQUIRE(f32_to_bf16(1.0f) == 0x3f80);
}

TEST_CASE("hand-made Q4_1 and Q8_0 blocks dequantize as specified", "[kernels][quant]") {
  BlockQ4_1 b{};
  b.d = f32_to_f16(0.5f);
  b.m = f32_to_f16(-1.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  REQUIRE(cpu::dequantize_row_ref(DType::Q4_1, &b, y, 32));
  REQUIRE(y[0] == -1.0f);
  REQUIRE(y[3] == 0.5f);
  REQUIRE(y[16] == 6.5f);  // 15 * 0.5 - 1
  BlockQ8_0 q{};
  q.d = f32_to_f16(0.25f);
  for (int j = 0; j < 32; ++j) q.qs[j] = static_cast<int8_t>(j - 16);
  REQUIRE(cpu::dequantize_row_ref(DType::Q8_0, &q, y, 32));
  REQUIRE(y[0] == -4.0f);
  REQUIRE(y[31] == 3.75f);
}

TEST_CASE("quantize then dequantize stays within the type's step", "[kernels][quant]") {
  std::mt19937 rng(3);
  const std::pair<DType, float> cases[] = {{DType::Q4_0, 0.16f}, {DType::Q4_1, 0.12f}, {DType::Q5_0, 0.07f},
                                           {DType::Q5_1, 0.06f}, {DType::Q8_0, 0.01f}, {DType::F16, 1e-3f},
                                           {DType::BF16, 8e-3f}};
  for (auto [type, rel] : cases) {
    auto x = test::random_floats(256, rng);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    std::vector<uint8_t> q(*row_bytes(type, 256));
    std::vector<float> y(256);
    REQUIRE(cpu::quantize_row_ref(type, x.data(), q.data(), 256));
    REQUIRE(cpu::dequantize_row_ref(type, q.data(), y.data(), 256));
    for (int i = 0; i < 256; ++i) REQUIRE(std::fabs(x[i] - y[i]) <= rel * amax);
  }
}
