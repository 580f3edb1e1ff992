// The step-cost model that stands in for the workers: a roofline per step from the model
// config and a hardware profile. A step's time is the fixed per-step overhead plus the
// larger of its compute time (matmul FLOPs over every token, attention FLOPs over the
// actual context lengths, each at the profile's peak times its own efficiency) and its memory time
// (weights once per step, KV read over the contexts and written for the new tokens, at the
// profile's bandwidth times an efficiency each). Profiles are small JSON files (sim/profiles/).
#pragma once
#include <string>
#include <vector>

#include "common/result.h"
#include "runtime/model/model_config.h"

namespace troupe::sim {

struct HardwareProfile {
  std::string name;
  double peak_flops = 1e12;       // dense matmul FLOP/s at the weights' compute type
  double mem_bandwidth = 1e11;    // bytes/s
  double flops_efficiency = 1.0;  // fitted by `troupe sim calibrate`
  double bw_efficiency = 1.0;
  double attention_efficiency = 1.0;  // attention FLOPs' share of peak (absent: flops_efficiency)
  double kv_bw_efficiency = 1.0;      // KV-cache reads and writes (absent: bw_efficiency)
  // true: a step takes the larger of its compute and memory times (a GPU overlaps them);
  // false: their sum (a CPU core streaming weights is not also multiplying).
  bool overlap = true;
  double step_overhead_s = 0.0;         // fixed cost per step (launches, scheduling, planning)
  double sample_overhead_s = 0.0;       // cost per sampled row beyond its logits matmul (softmax, sampling)
  double weight_bytes_per_param = 2.0;  // 2: bf16; 0.625: Q4_1
  double kv_bytes_per_elem = 2.0;       // f16 KV cache
  // What serving adds (fitted by `sim calibrate` through a real troupe serve) is part of the
  // two overheads above; these are the engine's alone (absent: the same as above).
  double engine_step_overhead_s = -1, engine_sample_overhead_s = -1;
  // Expert workers (Layout::expert_workers): a MoE layer's hand-off to them and back costs
  // expert_hop_s per step (messages, wake-ups) plus expert_row_s per routed row (copying the
  // rows out and the results back, the codec over a node link). Fitted by `sim calibrate
  // --expert-parallel / --expert-placement` on this machine; 0 when absent.
  double expert_hop_s = 0, expert_row_s = 0;
  // Mixture-of-experts: a fixed cost per expert a step runs in each layer (its matmul and
  // activation launches over the worker threads), fitted by `sim calibrate` on a MoE model.
  double expert_launch_s = 0;
};

Result<HardwareProfile> load_profile(const std::string& path);
std::string profile_json(const HardwareProfile& p);

// How the simulated model is laid out over devices; the defaults are one device.
struct Layout {
  // Pipeline parallelism: layers split evenly over `pipeline_stages` devices; a step's
  // sequences are cut into `micro_batches` plans in flight that follow each other through
  // the stages (GPipe); activations cross each stage boundary at `stage_bandwidth` bytes/s
  // (0: free) plus `stage_latency_s`.
  int32_t pipeline_stages = 1, micro_batches = 1;
  double stage_bandwidth = 0, stage_latency_s = 0;
  // Mixture of experts (from the model config: num_local_experts / num_experts /
  // n_routed_experts, num_experts_per_tok, moe_intermediate_size; 0: a dense model) and
  // expert parallelism: `ep_degree` devices run attention data-parallel (tokens split
  // evenly) and hold num_experts / ep_degree experts each; the busiest device gets
  // `expert_imbalance` times the mean routed tokens; two all-to-alls per layer move each
  // token's hidden state to and from its experts at `all_to_all_bandwidth` bytes/s per device.
  // (A GGUF's or a model directory's own config fills these in when they are 0.)
  int32_t num_experts = 0, experts_per_token = 0, expert_ffn = 0, shared_ffn = 0;
  int32_t ep_degree = 1;
  // Expert workers, as `troupe serve --expert-parallel N` runs them: attention, router,
  // shared expert and logits on the stage; each MoE layer hands the routed rows to
  // `expert_workers` actors holding num_experts / N experts each, waits for the busiest and
  // combines (the profile's expert_hop_s and expert_row_s price the hand-off). They share
  // the stage's device (one machine's cores split between them) unless
  // `expert_workers_apart` (each on its own device of the profile). 0: experts in the stage.
  int32_t expert_workers = 0;
  bool expert_workers_apart = false;
  double all_to_all_bandwidth = 0, expert_imbalance = 1.0;
  double activation_bytes = 2;  // bytes per activation element on the wire
};

// Fills the layout's mixture-of-experts fields from the model's own config where they are 0.
void fill_moe_from_model(Layout& layout, const ModelConfig& cfg);
// The busiest of `workers` expert workers' routed rows when `tokens` tokens each pick k of E
// experts uniformly at random (the experts split evenly): the mean plus the expected
// maximum of the workers' spread (normal approximation), at most every row.
double busiest_worker_rows(double tokens, int32_t k, int32_t experts, int32_t workers);

// Reads the mixture-of-experts fields of a Hugging Face config.json into `layout`.
Status read_moe_fields(const std::string& config_path, Layout& layout);
// Checks a layout's ranges and that it fits the model (stages <= layers, ep_degree divides
// the experts).
Status check_layout(const Layout& layout, const ModelConfig& cfg);

// One sequence of a step: tokens already cached and tokens computed now.
struct SeqShape {
  int32_t num_computed = 0;
  int32_t num_new = 0;
  bool samples = false;  // needs a logits row
  int32_t drafts = 0;    // speculative drafts among num_new: a logits row each besides
  int32_t rows() const { return samples ? 1 + drafts : 0; }
};

class CostModel {
 public:
  CostModel(const ModelConfig& cfg, const HardwareProfile& hw, const Layout& layout = {});
  double step_seconds(const std::vector<SeqShape>& seqs) const;
  double flops(const std::vector<SeqShape>& seqs) const;
  // The parts of flops(): matmuls (weights times tokens, logits rows) and attention.
  double matmul_flops(const std::vector<SeqShape>& seqs) const;
  double attention_flops(const std::vector<SeqShape>& seqs) const;
  double bytes(const std::vector<SeqShape>& seqs) const;  // weight_bytes() + kv_bytes()
  double weight_bytes() const;
  double kv_bytes(const std::vector<SeqShape>& seqs) const;
  const HardwareProfile& hardware() const { return hw_; }
  const Layout& layout() const { return layout_; }

 private:
  // One device's compute and memory time for `seqs` over a `share` of the layers.
  double device_seconds(const std::vector<SeqShape>& seqs, double share) const;
  double moe_device_seconds(const std::vector<SeqShape>& seqs) const;
  double expert_workers_seconds(const std::vector<SeqShape>& seqs) const;
  ModelConfig cfg_;
  HardwareProfile hw_;
  Layout layout_;
  double layer_params_ = 0, output_params_ = 0, kv_bytes_per_token_ = 0;
  double attn_params_ = 0, expert_params_ = 0;  // per layer; MoE only
};

}  // namespace troupe::sim
