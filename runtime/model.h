// A decoder-only transformer over the backend interface. The architecture files in
// runtime/models/ turn file metadata into a ModelConfig and say which optional tensors a
// family has; the forward pass here is shared by every Llama-like family.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model_config.h"
#include "runtime/weights.h"

namespace troupe {

using ProgressFn = std::function<void(size_t done, size_t total)>;

class Model {
 public:
  // Builds backend weights for every tensor the config needs; checks names and shapes.
  static Result<std::unique_ptr<Model>> build(const ModelConfig& cfg, const WeightSource& src, Backend& backend,
                                              int32_t max_batch_tokens, const ProgressFn& progress = {});

  const ModelConfig& config() const { return cfg_; }
  int32_t max_batch_tokens() const { return max_tokens_; }

  // Runs one packed step. Writes logits [num_logits, vocab] for the token rows listed in
  // logit_rows. The step is validated against the cache first (ids, positions, blocks).
  Status forward(const StepInputs& step, KvCache& cache, const int32_t* logit_rows, int32_t num_logits,
                 float* logits);

 private:
  struct Layer {
    std::unique_ptr<Weight> qkv;          // fused when q, k, v share a type
    std::unique_ptr<Weight> q, k, v;      // otherwise
    std::unique_ptr<Weight> o, gate_up, down;
    std::unique_ptr<Weight> gate, up;     // when gate and up types differ
    std::vector<float> attn_norm, ffn_norm, qkv_bias;
  };
  Status validate_step(const StepInputs& step, const KvCache& cache, const int32_t* rows, int32_t n) const;

  ModelConfig cfg_;
  Backend* backend_ = nullptr;
  int32_t max_tokens_ = 0;
  std::unique_ptr<Weight> embed_, output_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  // Scratch, sized for max_batch_tokens.
  float *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *gu_ = nullptr, *act_ = nullptr;
  float *cos_sin_ = nullptr, *last_ = nullptr;
};

}  // namespace troupe
