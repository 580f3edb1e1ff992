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
    p.attention_efficiency = j.value("attention_efficiency", p.flops_efficiency);
    p.kv_bw_efficiency = j.value("kv_bw_efficiency", p.bw_efficiency);
    p.overlap = j.value("overlap", true);
    p.step_overhead_s = j.value("step_overhead_s", 0.0);
    p.sample_overhead_s = j.value("sample_overhead_s", 0.0);
    p.weight_bytes_per_param = j.value("weight_bytes_per_param", 2.0);
    p.kv_bytes_per_elem = j.value("kv_bytes_per_elem", 2.0);
    p.engine_step_overhead_s = j.value("engine_step_overhead_s", p.step_overhead_s);
    p.engine_sample_overhead_s = j.value("engine_sample_overhead_s", p.sample_overhead_s);
    p.expert_hop_s = j.value("expert_hop_s", 0.0);
    p.expert_row_s = j.value("expert_row_s", 0.0);
    p.expert_launch_s = j.value("expert_launch_s", 0.0);
  } catch (const std::exception& e) { return make_error(path + ": " + e.what()); }
  for (double v : {p.peak_flops, p.mem_bandwidth, p.flops_efficiency, p.bw_efficiency, p.attention_efficiency,
                   p.kv_bw_efficiency, p.weight_bytes_per_param, p.kv_bytes_per_elem})
    if (!(v > 0) || !std::isfinite(v)) return make_error(path + ": rates, efficiencies and sizes must be > 0");
  for (double v : {p.step_overhead_s, p.sample_overhead_s, p.engine_step_overhead_s, p.engine_sample_overhead_s,
                   p.expert_hop_s, p.expert_row_s, p.expert_launch_s})
    if (!(v >= 0) || !std::isfinite(v))
      return make_error(path + ": the overheads (step, sample, engine_*, expert_*) must be >= 0");
  return p;
}

std::string profile_json(const HardwareProfile& p) {
  nlohmann::json j = {
      {"name", p.name},
      {"peak_flops", p.peak_flops},
      {"mem_bandwidth", p.mem_bandwidth},
      {"flops_efficiency", p.flops_efficiency},
      {"bw_efficiency", p.bw_efficiency},
      {"attention_efficiency", p.attention_efficiency},
      {"kv_bw_efficiency", p.kv_bw_efficiency},
      {"overlap", p.overlap},
      {"step_overhead_s", p.step_overhead_s},
      {"sample_overhead_s", p.sample_overhead_s},
      {"weight_bytes_per_param", p.weight_bytes_per_param},
      {"kv_bytes_per_elem", p.kv_bytes_per_elem},
      {"engine_step_overhead_s", p.engine_step_overhead_s >= 0 ? p.engine_step_overhead_s : p.step_overhead_s},
      {"engine_sample_overhead_s", p.engine_sample_overhead_s >= 0 ? p.engine_sample_overhead_s : p.sample_overhead_s}};
  j["expert_launch_s"] = p.expert_launch_s;
  j["expert_hop_s"] = p.expert_hop_s;
  j["expert_row_s"] = p.expert_row_s;
  return j.dump(2) + "\n";
}

Status read_moe_fields(const std::string& path, Layout& l) {
  std::ifstream f(path);
  if (!f) return make_error("cannot open model config '" + path + "'");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(path + ": not a JSON object");
  auto get = [&](std::initializer_list<const char*> names, int32_t dflt) -> Result<int32_t> {
    for (const char* n : names) {
      auto it = j.find(n);
      if (it == j.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 24))
        return make_error(path + ": '" + n + "' must be an integer 0..16M");
      return static_cast<int32_t>(it->get<int64_t>());
    }
    return dflt;
  };
  auto e = get({"num_local_experts", "num_experts", "n_routed_experts"}, 0);
  auto k = get({"num_experts_per_tok"}, 0);
  auto ffn = get({"moe_intermediate_size", "intermediate_size"}, 0);
  auto shared = get({"shared_expert_intermediate_size"}, 0);
  if (!shared) return shared.error();
  if (!e) return e.error();
  if (!k) return k.error();
  if (!ffn) return ffn.error();
  l.num_experts = *e;
  l.experts_per_token = *e > 0 ? *k : 0;
  l.expert_ffn = *e > 0 ? *ffn : 0;
  l.shared_ffn = *e > 0 ? *shared : 0;
  return {};
}

void fill_moe_from_model(Layout& l, const ModelConfig& c) {
  if (l.num_experts > 0 || !c.moe.enabled()) return;
  l.num_experts = c.moe.num_experts;
  l.experts_per_token = c.moe.experts_per_tok;
  l.expert_ffn = c.moe.expert_ffn;
  l.shared_ffn = c.moe.shared_ffn;
}

double busiest_worker_rows(double tokens, int32_t k, int32_t experts, int32_t workers) {
  const double rows = tokens * k;
  if (workers <= 1 || experts <= 1 || rows <= 0) return rows;
  const double p = 1.0 / workers;
  // A token's k distinct experts land on one worker hypergeometrically: variance
  // k p (1 - p) (E - k) / (E - 1); tokens are independent.
  const double sigma = std::sqrt(tokens * k * p * (1 - p) * double(experts - k) / double(experts - 1));
  // E[max] of W standard normals (order statistics; sqrt(2 ln W) beyond the table).
  static const double kMax[] = {0, 0, 0.5642, 0.8463, 1.0294, 1.1630, 1.2672, 1.3522, 1.4236};
  const double c = workers < 9 ? kMax[workers] : std::sqrt(2 * std::log(double(workers)));
  return std::min(rows, rows * p + c * sigma);
}

Status check_layout(const Layout& layout, const ModelConfig& c) {
  Layout l = layout;
  fill_moe_from_model(l, c);
  if (l.pipeline_stages < 1 || l.pipeline_stages > c.num_layers)
    return make_error("--pipeline-stages must be 1.." + std::to_string(c.num_layers) + " (the model's layers)");
  if (l.micro_batches < 1 || l.micro_batches > 1024) return make_error("--micro-batches must be 1..1024");
  if (!(l.stage_bandwidth >= 0) || !(l.stage_latency_s >= 0) || !(l.all_to_all_bandwidth >= 0) ||
      !(l.activation_bytes > 0))
    return make_error("bandwidths and latencies must be >= 0");
  if (!(l.expert_imbalance >= 1) || !std::isfinite(l.expert_imbalance))
    return make_error("--expert-imbalance must be >= 1 (the busiest device over the mean)");
  if (l.ep_degree < 1) return make_error("--ep-degree must be >= 1");
  if (l.num_experts > 0 && (l.experts_per_token < 1 || l.experts_per_token > l.num_experts || l.expert_ffn < 1))
    return make_error("the model config's experts: need 1 <= num_experts_per_tok <= experts and an expert FFN size");
  if (l.ep_degree > 1 && (l.num_experts == 0 || l.num_experts % l.ep_degree != 0))
    return make_error("--ep-degree " + std::to_string(l.ep_degree) + " needs a mixture-of-experts model whose " +
                      std::to_string(l.num_experts) + " experts it divides");
  if (l.expert_workers < 0 || l.expert_workers > 4096) return make_error("--expert-workers must be 0..4096");
  if (l.expert_workers > 0 && l.num_experts == 0)
    return make_error("--expert-workers needs a mixture-of-experts model config");
  if (l.expert_workers > l.num_experts && l.num_experts > 0)
    return make_error("--expert-workers " + std::to_string(l.expert_workers) + " is more than the model's " +
                      std::to_string(l.num_experts) + " experts");
  if (l.expert_workers > 0 && l.ep_degree > 1)
    return make_error("give --ep-degree (attention data-parallel devices) or --expert-workers, not both");
  if (l.num_experts > 0 && l.pipeline_stages > 1)
    return make_error(
        "pipeline stages are modelled for dense models only; use --pipeline-stages 1 with a "
        "mixture-of-experts config");
  return {};
}

CostModel::CostModel(const ModelConfig& c, const HardwareProfile& hw, const Layout& layout)
    : cfg_(c), hw_(hw), layout_(layout) {
  fill_moe_from_model(layout_, c);
  const double H = c.hidden, q = double(c.num_heads) * c.head_dim, kv = double(c.num_kv_heads) * c.head_dim;
  attn_params_ = H * (q + 2 * kv) + q * H;
  if (layout_.num_experts > 0) {
    expert_params_ = 3 * H * double(layout_.expert_ffn);
    attn_params_ += H * layout_.num_experts;                                             // the router
    if (layout_.shared_ffn > 0) attn_params_ += 3 * H * double(layout_.shared_ffn) + H;  // and its gate
    // Per token: attention and router, and k experts.
    layer_params_ = attn_params_ + layout_.experts_per_token * expert_params_;
  } else {
    layer_params_ = attn_params_ + 3 * H * c.ffn;
  }
  output_params_ = H * double(c.vocab);
  kv_bytes_per_token_ = 2.0 * kv * c.num_layers * hw.kv_bytes_per_elem;
}

double CostModel::matmul_flops(const std::vector<SeqShape>& seqs) const {
  double tokens = 0, logits = 0;
  for (const auto& s : seqs) {
    tokens += s.num_new;
    logits += s.rows();
  }
  return 2 * layer_params_ * cfg_.num_layers * tokens + 2 * output_params_ * logits;
}

double CostModel::attention_flops(const std::vector<SeqShape>& seqs) const {
  double attn = 0;
  // Each new token attends to everything before it and itself (causal).
  for (const auto& s : seqs) attn += double(s.num_new) * (double(s.num_computed) + (double(s.num_new) + 1) / 2);
  return 4.0 * cfg_.num_layers * cfg_.num_heads * cfg_.head_dim * attn;
}

double CostModel::flops(const std::vector<SeqShape>& seqs) const { return matmul_flops(seqs) + attention_flops(seqs); }

double CostModel::weight_bytes() const {
  const double layer = layout_.num_experts > 0 ? attn_params_ + layout_.num_experts * expert_params_ : layer_params_;
  return hw_.weight_bytes_per_param * (layer * cfg_.num_layers + output_params_);
}

double CostModel::kv_bytes(const std::vector<SeqShape>& seqs) const {
  double ctx = 0, tokens = 0;
  for (const auto& s : seqs) {
    ctx += double(s.num_computed) + s.num_new;
    tokens += s.num_new;
  }
  return kv_bytes_per_token_ * (ctx + tokens);
}

double CostModel::bytes(const std::vector<SeqShape>& seqs) const { return weight_bytes() + kv_bytes(seqs); }

double CostModel::device_seconds(const std::vector<SeqShape>& seqs, double share) const {
  const double compute = share * (matmul_flops(seqs) / (hw_.peak_flops * hw_.flops_efficiency) +
                                  attention_flops(seqs) / (hw_.peak_flops * hw_.attention_efficiency));
  const double memory = share * (weight_bytes() / (hw_.mem_bandwidth * hw_.bw_efficiency) +
                                 kv_bytes(seqs) / (hw_.mem_bandwidth * hw_.kv_bw_efficiency));
  return hw_.overlap ? std::max(compute, memory) : compute + memory;
}

// Expert parallelism over D devices: attention data-parallel (1/D of the tokens, all
// attention weights on every device), experts sharded (E/D each, the busiest device taking
// the imbalance times the mean), two all-to-alls per layer.
double CostModel::moe_device_seconds(const std::vector<SeqShape>& seqs) const {
  const Layout& l = layout_;
  const double D = l.ep_degree, L = cfg_.num_layers;
  double tokens = 0, rows = 0;
  for (const auto& s : seqs) {
    tokens += s.num_new;
    rows += s.rows();
  }
  const double routed = std::min(tokens * l.experts_per_token, tokens * l.experts_per_token / D * l.expert_imbalance);
  const double flops = 2 * attn_params_ * L * tokens / D + 2 * expert_params_ * L * routed +
                       2 * output_params_ * rows / D + attention_flops(seqs) / D;
  const double attn_flops = attention_flops(seqs) / D;
  // Experts a device reads: each of its E/D experts that at least one routed token picks.
  const double local = l.num_experts / D;
  const double touched = local * (1 - std::pow(1 - 1.0 / local, std::max(1.0, routed)));
  const double wbytes = hw_.weight_bytes_per_param * (L * (attn_params_ + touched * expert_params_) + output_params_);
  const double compute = (flops - attn_flops) / (hw_.peak_flops * hw_.flops_efficiency) +
                         attn_flops / (hw_.peak_flops * hw_.attention_efficiency);
  const double memory = wbytes / (hw_.mem_bandwidth * hw_.bw_efficiency) +
                        kv_bytes(seqs) / D / (hw_.mem_bandwidth * hw_.kv_bw_efficiency);
  double a2a = 0;
  if (D > 1 && l.all_to_all_bandwidth > 0)
    a2a = L * 2 * (tokens / D) * l.experts_per_token * cfg_.hidden * l.activation_bytes * (D - 1) / D /
          l.all_to_all_bandwidth;
  return (hw_.overlap ? std::max(compute, memory) : compute + memory) + a2a + L * touched * hw_.expert_launch_s;
}

// Expert workers: the stage computes everything but the routed experts (the workers wait),
// then hands the routed rows over and waits for the busiest worker (the stage waits); the
// two parts follow each other, so their times add.
double CostModel::expert_workers_seconds(const std::vector<SeqShape>& seqs) const {
  const Layout& l = layout_;
  const double L = cfg_.num_layers, W = l.expert_workers;
  double tokens = 0, rows = 0;
  for (const auto& s : seqs) {
    tokens += s.num_new;
    rows += s.rows();
  }
  auto device = [&](double compute, double memory) {
    return hw_.overlap ? std::max(compute, memory) : compute + memory;
  };
  const double attn_flops = attention_flops(seqs);
  const double dense = device(
      2 * (attn_params_ * L * tokens + output_params_ * rows) / (hw_.peak_flops * hw_.flops_efficiency) +
          attn_flops / (hw_.peak_flops * hw_.attention_efficiency),
      hw_.weight_bytes_per_param * (L * attn_params_ + output_params_) / (hw_.mem_bandwidth * hw_.bw_efficiency) +
          kv_bytes(seqs) / (hw_.mem_bandwidth * hw_.kv_bw_efficiency));
  // The busiest worker's rows (uniform routing's spread times any skew of the router), over
  // its E / W experts, of which it reads those picked at least once.
  const double routed = tokens * l.experts_per_token;
  const double busiest = std::min(
      routed, l.expert_imbalance * busiest_worker_rows(tokens, l.experts_per_token, l.num_experts, l.expert_workers));
  const double local = double(l.num_experts) / W;
  const double touched = local * (1 - std::pow(1 - 1.0 / local, std::max(1.0, busiest)));
  double experts =
      device(2 * expert_params_ * L * busiest / (hw_.peak_flops * hw_.flops_efficiency),
             hw_.weight_bytes_per_param * L * touched * expert_params_ / (hw_.mem_bandwidth * hw_.bw_efficiency));
  // Sharing one device, each worker has 1 / W of it (its launches wait no longer).
  if (!l.expert_workers_apart) experts *= W;
  experts += L * touched * hw_.expert_launch_s;
  const double handoff = L * (hw_.expert_hop_s + hw_.expert_row_s * routed);
  return dense + experts + handoff;
}

double CostModel::step_seconds(const std::vector<SeqShape>& seqs) const {
  double rows = 0;
  for (const auto& s : seqs) rows += s.rows();
  const double fixed = hw_.step_overhead_s + hw_.sample_overhead_s * rows;
  const Layout& l = layout_;
  if (l.num_experts > 0 && l.expert_workers > 0) return fixed + expert_workers_seconds(seqs);
  if (l.num_experts > 0) return fixed + moe_device_seconds(seqs);
  if (l.pipeline_stages <= 1) return fixed + device_seconds(seqs, 1.0);
  // Pipeline: micro-batch g takes t_g per stage (its share of the layers plus moving its
  // activations on); GPipe's fill and drain give sum(t_g) + (P - 1) * max(t_g).
  const int32_t P = l.pipeline_stages;
  const size_t M = std::min<size_t>(static_cast<size_t>(l.micro_batches), seqs.size());
  std::vector<std::vector<SeqShape>> groups(std::max<size_t>(M, 1));
  for (size_t i = 0; i < seqs.size(); ++i) groups[i % groups.size()].push_back(seqs[i]);
  double sum = 0, worst = 0;
  for (const auto& g : groups) {
    double tokens = 0;
    for (const auto& s : g) tokens += s.num_new;
    const double hop =
        (l.stage_bandwidth > 0 ? tokens * cfg_.hidden * l.activation_bytes / l.stage_bandwidth : 0) + l.stage_latency_s;
    // P - 1 boundary crossings per micro-batch, spread over its P stage slots.
    const double t = device_seconds(g, 1.0 / P) + hop * (P - 1) / P;
    sum += t;
    worst = std::max(worst, t);
  }
  return fixed + sum + (P - 1) * worst;
}

}  // namespace troupe::sim
