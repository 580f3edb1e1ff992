#include "sim/cost_model.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

namespace troupe::sim {

Result<HardwareProfile> load_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error("cannot open hardware profile '" + path + "'");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(path + ": not a JSON object");
  HardwareProfile p;
  try {
    p.name = j.value("name", path);
    p.peak_flops = j.at("peak_flops").get<double>();
    p.mem_bandwidth = j.at("mem_bandwidth").get<double>();
    p.flops_efficiency = j.value("flops_efficiency", 1.0);
    p.bw_efficiency = j.value("bw_efficiency", 1.0);
    p.step_overhead_s = j.value("step_overhead_s", 0.0);
    p.weight_bytes_per_param = j.value("weight_bytes_per_param", 2.0);
    p.kv_bytes_per_elem = j.value("kv_bytes_per_elem", 2.0);
  } catch (const std::exception& e) {
    return make_error(path + ": " + e.what());
  }
  for (double v : {p.peak_flops, p.mem_bandwidth, p.flops_efficiency, p.bw_efficiency, p.weight_bytes_per_param,
                   p.kv_bytes_per_elem})
    if (!(v > 0) || !std::isfinite(v)) return make_error(path + ": rates, efficiencies and sizes must be > 0");
  if (!(p.step_overhead_s >= 0)) return make_error(path + ": step_overhead_s must be >= 0");
  return p;
}

std::string profile_json(const HardwareProfile& p) {
  nlohmann::json j = {{"name", p.name},
                      {"peak_flops", p.peak_flops},
                      {"mem_bandwidth", p.mem_bandwidth},
                      {"flops_efficiency", p.flops_efficiency},
                      {"bw_efficiency", p.bw_efficiency},
                      {"step_overhead_s", p.step_overhead_s},
                      {"weight_bytes_per_param", p.weight_bytes_per_param},
                      {"kv_bytes_per_elem", p.kv_bytes_per_elem}};
  return j.dump(2) + "\n";
}

CostModel::CostModel(const ModelConfig& c, const HardwareProfile& hw) : cfg_(c), hw_(hw) {
  const double H = c.hidden, q = double(c.num_heads) * c.head_dim, kv = double(c.num_kv_heads) * c.head_dim;
  layer_params_ = H * (q + 2 * kv) + q * H + 3 * H * c.ffn;
  output_params_ = H * double(c.vocab);
  kv_bytes_per_token_ = 2.0 * kv * c.num_layers * hw.kv_bytes_per_elem;
}

double CostModel::flops(const std::vector<SeqShape>& seqs) const {
  double tokens = 0, logits = 0, attn = 0;
  for (const auto& s : seqs) {
    tokens += s.num_new;
    logits += s.samples ? 1 : 0;
    // Each new token attends to everything before it and itself (causal).
    attn += double(s.num_new) * (double(s.num_computed) + (double(s.num_new) + 1) / 2);
  }
  return 2 * layer_params_ * cfg_.num_layers * tokens + 2 * output_params_ * logits +
         4.0 * cfg_.num_layers * cfg_.num_heads * cfg_.head_dim * attn;
}

double CostModel::bytes(const std::vector<SeqShape>& seqs) const {
  double ctx = 0, tokens = 0;
  for (const auto& s : seqs) {
    ctx += double(s.num_computed) + s.num_new;
    tokens += s.num_new;
  }
  return hw_.weight_bytes_per_param * (layer_params_ * cfg_.num_layers + output_params_) +
         kv_bytes_per_token_ * (ctx + tokens);
}

double CostModel::step_seconds(const std::vector<SeqShape>& seqs) const {
  const double compute = flops(seqs) / (hw_.peak_flops * hw_.flops_efficiency);
  const double memory = bytes(seqs) / (hw_.mem_bandwidth * hw_.bw_efficiency);
  return hw_.step_overhead_s + std::max(compute, memory);
}

}  // namespace troupe::sim
