#include "runtime/model/model_config.h"

#include <cmath>
#include <cstdio>

namespace troupe {

Status ModelConfig::validate() const {
  auto bad = [](const std::string& f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);  // (integers print as integers)
    return make_error("model config: " + f + " is " + buf);
  };
  if (num_layers <= 0 || num_layers > 1024) return bad("num_layers", num_layers);
  if (hidden <= 0 || hidden > (1 << 17)) return bad("hidden size", hidden);
  if (num_heads <= 0 || num_heads > 1024) return bad("num_heads", num_heads);
  if (num_kv_heads <= 0 || num_kv_heads > num_heads || num_heads % num_kv_heads != 0)
    return make_error("model config: num_kv_heads " + std::to_string(num_kv_heads) + " must divide num_heads " +
                      std::to_string(num_heads));
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > 1024) return bad("head_dim", head_dim);
  if (ffn <= 0 || ffn > (1 << 20)) return bad("ffn size", ffn);
  if (vocab <= 0 || vocab > (1 << 22)) return bad("vocab size", vocab);
  if (max_context <= 0 || max_context > (1 << 24)) return bad("context length", max_context);
  if (!std::isfinite(rms_eps) || rms_eps <= 0 || rms_eps > 1) return bad("rms_norm_eps", rms_eps);
  if (!std::isfinite(rope_theta) || rope_theta <= 0) return bad("rope_theta", rope_theta);
  if (!std::isfinite(rope_scaling.factor) || rope_scaling.factor <= 0)
    return bad("rope scaling factor", rope_scaling.factor);
  if (moe.num_experts != 0) {
    if (moe.num_experts < 0 || moe.num_experts > 4096) return bad("expert count", moe.num_experts);
    if (moe.experts_per_tok <= 0 || moe.experts_per_tok > moe.num_experts)
      return make_error("model config: experts per token " + std::to_string(moe.experts_per_tok) + " must be in [1, " +
                        std::to_string(moe.num_experts) + "] (the expert count)");
    if (moe.expert_ffn <= 0 || moe.expert_ffn > (1 << 20)) return bad("expert ffn size", moe.expert_ffn);
    if (moe.shared_ffn < 0 || moe.shared_ffn > (1 << 20)) return bad("shared expert ffn size", moe.shared_ffn);
  } else if (moe.experts_per_tok != 0) {
    return make_error("model config: experts per token " + std::to_string(moe.experts_per_tok) + " without experts");
  }
  return {};
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int half = head_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    f[i] = static_cast<float>(std::pow(static_cast<double>(rope_theta), -2.0 * i / head_dim));
  if (rope_scaling.type == "linear") {
    for (auto& x : f) x /= rope_scaling.factor;
  } else if (rope_scaling.type == "llama3") {
    const double lo_wavelen = rope_scaling.original_max_position / rope_scaling.low_freq_factor;
    const double hi_wavelen = rope_scaling.original_max_position / rope_scaling.high_freq_factor;
    for (auto& x : f) {
      const double wavelen = 2 * M_PI / x;
      if (wavelen < hi_wavelen) continue;
      if (wavelen > lo_wavelen) {
        x = static_cast<float>(x / rope_scaling.factor);
        continue;
      }
      const double smooth = (rope_scaling.original_max_position / wavelen - rope_scaling.low_freq_factor) /
                            (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
      x = static_cast<float>((1 - smooth) * x / rope_scaling.factor + smooth * x);
    }
  }
  if (rope_freq_factors.size() == f.size())
    for (size_t i = 0; i < f.size(); ++i) f[i] /= rope_freq_factors[i];
  return f;
}

}  // namespace troupe
