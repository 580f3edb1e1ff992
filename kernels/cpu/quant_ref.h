// Reference (scalar, obviously-correct) conversions between float rows and every
// supported GGUF type. These define the numerics the fast kernels are tested against.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace troupe::cpu {

// Dequantizes `n` elements (a multiple of the type's block size) of `src` into `dst`.
// Returns false for a type without a dequantizer (never for the GGUF weight types).
bool dequantize_row_ref(DType type, const void* src, float* dst, int64_t n);

// Quantizes `n` floats into `type`. Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q8_1 (activations), Q8_K (activations). K-quant weight types are not produced
// here (tests build them from random blocks).
bool quantize_row_ref(DType type, const float* src, void* dst, int64_t n);

}  // namespace troupe::cpu
