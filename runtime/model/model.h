// A decoder-only transformer over the backend interface. The architecture files in
// runtime/models/ turn file metadata into a ModelConfig and say which optional tensors a
// family has; the forward pass here is shared by every Llama-like family.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "runtime/model/ffn.h"
#include "runtime/model/model_config.h"
#include "runtime/model/moe.h"
#include "runtime/format/weights.h"

namespace troupe {

using ProgressFn = std::function<void(size_t done, size_t total)>;

// A contiguous range of layers [first, last) held by one pipeline stage; last = -1: to the end.
struct LayerRange {
  int32_t first = 0;
  int32_t last = -1;
};

// Logit rows sampled on the backend (Backend::sample) instead of coming back as logits:
// rows whose params[i].on_device is set get tokens[i] and logprobs[i] when the backend
// can_sample(); every other row gets tokens[i] = -1 and its logits row as before.
struct DeviceSampling {
  const DeviceSampleParams* params = nullptr;  // [num_logits]
  int32_t* tokens = nullptr;                   // [num_logits] out
  float* logprobs = nullptr;                   // [num_logits] out
};

class Model {
 public:
  // Builds backend weights for every tensor the config needs; checks names and shapes.
  // routed_experts false: the MoE layers' routed experts are not loaded; they run on expert
  // workers through set_expert_dispatcher() (expert parallelism).
  static Result<std::unique_ptr<Model>> build(const ModelConfig& cfg, const WeightSource& src, Backend& backend,
                                              int32_t max_batch_tokens, const ProgressFn& progress = {},
                                              LayerRange range = {}, bool routed_experts = true);

  const ModelConfig& config() const { return cfg_; }
  int32_t max_batch_tokens() const { return max_tokens_; }
  int32_t first_layer() const { return first_layer_; }
  int32_t last_layer() const { return last_layer_; }  // exclusive
  int32_t num_stage_layers() const { return last_layer_ - first_layer_; }
  bool is_first_stage() const { return first_layer_ == 0; }
  bool is_last_stage() const { return last_layer_ == cfg_.num_layers; }

  // Runs one packed step. Writes logits [num_logits, vocab] for the token rows listed in
  // logit_rows. The step is validated against the cache first (ids, positions, blocks).
  // A whole-model Model only (first and last stage). The cache holds num_stage_layers layers.
  // With `sampling`, rows sampled on the device leave their logits rows unwritten; logits
  // may be null when every row is sampled on the device.
  Status forward(const StepInputs& step, KvCache& cache, const int32_t* logit_rows, int32_t num_logits, float* logits,
                 const DeviceSampling* sampling = nullptr);
  // One pipeline stage: the first stage embeds the tokens (hidden_in unused), the others
  // start from hidden_in [num_tokens, hidden]; a non-last stage writes hidden_out
  // [num_tokens, hidden]; the last stage writes the logits rows.
  Status forward_stage(const StepInputs& step, KvCache& cache, const float* hidden_in, float* hidden_out,
                       const int32_t* logit_rows, int32_t num_logits, float* logits,
                       const DeviceSampling* sampling = nullptr);
  // Self-drafting (speculative decoding): the first `layers` layers, then the final norm and
  // the LM head, over a step; writes those layers' KV as forward() would. A whole-model
  // Model only; 1 <= layers <= num_layers.
  Status forward_draft(const StepInputs& step, KvCache& cache, int32_t layers, const int32_t* logit_rows,
                       int32_t num_logits, float* logits);
  // Expert parallelism: every MoE layer's routed experts run through `d` (not owned; it must
  // outlive the model's steps) instead of on this backend. Needed when built without them.
  void set_expert_dispatcher(ExpertDispatcher* d);
  bool has_routed_experts() const { return routed_experts_; }
  // Routing counts (and, with a dispatcher, its costs) go into `stats` (shared, thread-safe).
  void set_moe_stats(std::shared_ptr<MoeStats> stats) { moe_stats_ = std::move(stats); }
  // Whether forward's DeviceSampling rows are sampled on the backend.
  bool samples_on_device() const { return backend_->can_sample(); }

 private:
  struct MoeLayer {
    std::unique_ptr<Weight> router;       // [experts, hidden]
    std::vector<Ffn> experts;             // empty when built without routed experts
    Ffn shared;                           // gate_up/gate null when the model has no shared expert
    std::unique_ptr<Weight> shared_gate;  // [1, hidden], null when ungated
  };
  struct Layer {
    std::unique_ptr<Weight> qkv;      // fused when q, k, v share a type
    std::unique_ptr<Weight> q, k, v;  // otherwise
    std::unique_ptr<Weight> o;
    Ffn ffn;  // dense models
    // Backend copies of the vectors (device memory on a GPU); qkv_bias null when absent.
    float *attn_norm = nullptr, *ffn_norm = nullptr, *qkv_bias = nullptr;
    float *q_norm = nullptr, *k_norm = nullptr;  // (ModelConfig::qk_norm)
    std::unique_ptr<MoeLayer> moe;               // mixture-of-experts models (ffn unset then)
  };
  void run_ffn(const Ffn& f, const float* x, int64_t n, int64_t ffn, float* y);
  // h_ (normed input) -> h_ (the layer's FFN output); `layer`: the model's layer index.
  Status run_moe(const MoeLayer& m, int32_t layer, int64_t n);
  // forward_stage over this stage's first `layers` layers (all of them but in a self-draft).
  Status run(const StepInputs& step, KvCache& cache, const float* hidden_in, float* hidden_out,
             const int32_t* logit_rows, int32_t num_logits, float* logits, const DeviceSampling* sampling,
             int32_t layers);
  Status validate_step(const StepInputs& step, const KvCache& cache, const int32_t* rows, int32_t n) const;

  ModelConfig cfg_;
  Backend* backend_ = nullptr;
  int32_t max_tokens_ = 0;
  int32_t first_layer_ = 0, last_layer_ = 0;
  std::unique_ptr<Weight> embed_, output_;
  float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  // Scratch, sized for max_batch_tokens.
  float *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *gu_ = nullptr, *act_ = nullptr;
  float *cos_sin_ = nullptr, *last_ = nullptr;
  float* logits_dev_ = nullptr;                   // [kLogitChunk, vocab], device backends only
  std::vector<float> cos_sin_host_;               // [max_batch_tokens, head_dim]
  std::vector<DeviceSampleParams> chunk_params_;  // one logits chunk's sampling settings
  // Mixture of experts: router logits [T, experts], gathered inputs and expert outputs
  // [T (k + 1), hidden], shared-gate logits [T]; the routing is decided on the host.
  float *router_ = nullptr, *moe_x_ = nullptr, *moe_y_ = nullptr, *shared_gate_ = nullptr;
  std::vector<float> router_host_, shared_gate_host_, moe_weights_;
  std::vector<int32_t> moe_rows_, moe_src_, moe_count_, moe_offset_, moe_cursor_, moe_combine_src_;
  bool routed_experts_ = true;
  ExpertDispatcher* dispatcher_ = nullptr;
  std::vector<float> moe_x_host_, moe_y_host_;  // dispatched rows, device backends only
  // The experts with rows this layer, for run_ffn_group (and its scratch over all routed rows
  // on a backend that groups matmuls).
  std::vector<const Ffn*> moe_ffns_;
  std::vector<int64_t> moe_group_counts_;
  float *moe_gu_ = nullptr, *moe_act_ = nullptr;
  std::shared_ptr<MoeStats> moe_stats_;
  static constexpr int32_t kLogitChunk = 64;
};

}  // namespace troupe
