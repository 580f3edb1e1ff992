#include <cmath>

#include "kernels/cpu/attention.h"  // exp_sub_row
#include "kernels/cpu/ops.h"

namespace troupe::cpu {

void rms_norm_rows(const float* x, const float* w, float eps, int64_t r0, int64_t r1, int64_t dim, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    // As GGML: the sum in double, the rest in float.
    const float mean = static_cast<float>(ss / static_cast<double>(dim));
    const float scale = 1.0f / std::sqrt(mean + eps);
    float* o = out + r * dim;
    for (int64_t j = 0; j < dim; ++j) o[j] = xr[j] * scale * w[j];
  }
}

void rope_rows(float* x, int64_t ld, int64_t r0, int64_t r1, int64_t num_heads, int64_t head_dim, const float* cos_sin,
               RopeStyle style) {
  const int64_t half = head_dim / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* cs = cos_sin + r * head_dim;
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + r * ld + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const int64_t a = style == RopeStyle::Interleaved ? 2 * i : i;
        const int64_t b = style == RopeStyle::Interleaved ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

void silu_mul_rows(const float* gu, int64_t r0, int64_t r1, int64_t ffn, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = gu + r * 2 * ffn;
    const float* u = g + ffn;
    float* o = out + r * ffn;
    // exp(-g) through the softmax's vector exp (std::exp's bits: checked for every float in
    // [-103.97, 88.5]; lanes above 88 go through std::exp), then the same division and product.
    for (int64_t j = 0; j < ffn; ++j) o[j] = -g[j];
    exp_sub_row(o, static_cast<int32_t>(ffn), 0.0f);
    for (int64_t j = 0; j < ffn; ++j) o[j] = g[j] / (1.0f + o[j]) * u[j];
  }
}

void add_range(float* x, const float* y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) x[i] += y[i];
}

}  // namespace troupe::cpu
