// The step-cost model that stands in for the workers: a roofline per step from the model
// config and a hardware profile. A step's time is the fixed per-step overhead plus the
// larger of its compute time (matmul FLOPs over every token, attention FLOPs over the
// actual context lengths, at the profile's peak times an efficiency) and its memory time
// (weights once per step, KV read over the contexts and written for the new tokens, at the
// profile's bandwidth times an efficiency). Profiles are small JSON files (sim/profiles/).
#pragma once
#include <string>
#include <vector>

#include "kernels/result.h"
#include "runtime/model_config.h"

namespace troupe::sim {

struct HardwareProfile {
  std::string name;
  double peak_flops = 1e12;       // dense matmul FLOP/s at the weights' compute type
  double mem_bandwidth = 1e11;    // bytes/s
  double flops_efficiency = 1.0;  // fitted by `troupe sim calibrate`
  double bw_efficiency = 1.0;
  double step_overhead_s = 0.0;   // fixed cost per step (launches, scheduling, sampling)
  double weight_bytes_per_param = 2.0;  // 2: bf16; 0.625: Q4_1
  double kv_bytes_per_elem = 2.0;       // f16 KV cache
};

Result<HardwareProfile> load_profile(const std::string& path);
std::string profile_json(const HardwareProfile& p);

// One sequence of a step: tokens already cached and tokens computed now.
struct SeqShape {
  int32_t num_computed = 0;
  int32_t num_new = 0;
  bool samples = false;  // needs a logits row
};

class CostModel {
 public:
  CostModel(const ModelConfig& cfg, const HardwareProfile& hw);
  double step_seconds(const std::vector<SeqShape>& seqs) const;
  double flops(const std::vector<SeqShape>& seqs) const;
  double bytes(const std::vector<SeqShape>& seqs) const;
  const HardwareProfile& hardware() const { return hw_; }

 private:
  ModelConfig cfg_;
  HardwareProfile hw_;
  double layer_params_ = 0, output_params_ = 0, kv_bytes_per_token_ = 0;
};

}  // namespace troupe::sim
