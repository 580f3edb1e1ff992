// Element-wise and attention ops of the CPU backend (single-threaded bodies; the backend
// splits work across its pool). Shapes in comments: [rows, cols], row-major.
#pragma once
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace troupe::cpu {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w   x, out: [n, dim] (may alias)
void rms_norm_rows(const float* x, const float* w, float eps, int64_t r0, int64_t r1, int64_t dim, float* out);

enum class RopeStyle : uint8_t { Interleaved /* GGUF llama: pairs (2i, 2i+1) */, Neox /* pairs (i, i+d/2) */ };
// cos_sin: [n, head_dim/2, 2] for each token. x: rows [n] of num_heads * head_dim, stride `ld`.
void rope_rows(float* x, int64_t ld, int64_t r0, int64_t r1, int64_t num_heads, int64_t head_dim, const float* cos_sin,
               RopeStyle style);

// out[r, j] = silu(gu[r, j]) * gu[r, ffn + j]   gu: [n, 2*ffn], out: [n, ffn]
void silu_mul_rows(const float* gu, int64_t r0, int64_t r1, int64_t ffn, float* out);

// x += y over [begin, end)
void add_range(float* x, const float* y, int64_t begin, int64_t end);

// Row helpers for the f16 KV cache and attention (runtime-dispatched F16C/FMA when present).
void f32_to_f16_row(const float* x, uint16_t* y, int64_t n);
// The KV cache's conversion: f32_to_f16_row held finite (fp16.h: f32_to_f16_kv).
void f32_to_f16_kv_row(const float* x, uint16_t* y, int64_t n);
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
void axpy_f32(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x

}  // namespace troupe::cpu
