#include "runtime/model/expert_shard.h"

#include <set>

namespace troupe {

Result<std::unique_ptr<ExpertShard>> ExpertShard::build(const ModelConfig& cfg, const WeightSource& src,
                                                        Backend& backend, int32_t max_rows,
                                                        const std::map<int32_t, std::vector<int32_t>>& experts,
                                                        const ProgressFn& progress) {
  TROUPE_TRY(cfg.validate());
  const MoeConfig& mc = cfg.moe;
  if (!mc.enabled()) return make_error("expert workers need a mixture-of-experts model");
  if (max_rows <= 0 || max_rows > (1 << 22)) return make_error("expert worker: max rows out of range");
  auto s = std::unique_ptr<ExpertShard>(new ExpertShard());
  s->cfg_ = cfg;
  s->backend_ = &backend;
  s->max_rows_ = max_rows;
  size_t done = 0;
  for (const auto& [layer, ids] : experts) {
    if (layer < 0 || layer >= cfg.num_layers)
      return make_error("expert worker: layer " + std::to_string(layer) + " is not in the model's " +
                        std::to_string(cfg.num_layers) + " layers");
    auto& per = s->ffn_[layer];
    for (int32_t e : ids) {
      if (e < 0 || e >= mc.num_experts)
        return make_error("expert worker: expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                          " is not in the model's " + std::to_string(mc.num_experts) + " experts");
      if (per.count(e))
        return make_error("expert worker: expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                          " is listed twice");
      TROUPE_TRY(build_expert_ffn(backend, src, layer, e, mc.num_experts, cfg.hidden, mc.expert_ffn, per[e]));
    }
    if (progress) progress(++done, experts.size());
  }
  const size_t rows = static_cast<size_t>(max_rows), H = static_cast<size_t>(cfg.hidden);
  // One expert's rows at a time: at most one row per token, but a dispatch may be all one expert's.
  if (!backend.is_host_memory()) {
    s->x_ = backend.alloc(rows * H);
    s->y_ = backend.alloc(rows * H);
  }
  s->gu_ = backend.alloc(rows * 2 * static_cast<size_t>(mc.expert_ffn));
  s->act_ = backend.alloc(rows * static_cast<size_t>(mc.expert_ffn));
  TROUPE_TRY(backend.sync());
  return s;
}

bool ExpertShard::holds(int32_t layer, int32_t expert) const {
  auto it = ffn_.find(layer);
  return it != ffn_.end() && it->second.count(expert) != 0;
}

Status ExpertShard::run(int32_t layer, const std::vector<int32_t>& experts, const std::vector<int32_t>& counts,
                        const float* x, size_t x_floats, float* y) {
  if (experts.size() != counts.size()) return make_error("expert dispatch: experts and counts differ in length");
  auto it = ffn_.find(layer);
  if (it == ffn_.end())
    return make_error("expert dispatch: this worker holds no expert of layer " + std::to_string(layer));
  const int64_t H = cfg_.hidden;
  int64_t total = 0;
  std::set<int32_t> seen;
  for (size_t i = 0; i < experts.size(); ++i) {
    if (!it->second.count(experts[i]))
      return make_error("expert dispatch: this worker does not hold expert " + std::to_string(experts[i]) +
                        " of layer " + std::to_string(layer));
    if (!seen.insert(experts[i]).second)
      return make_error("expert dispatch: expert " + std::to_string(experts[i]) + " appears twice");
    if (counts[i] <= 0 || counts[i] > max_rows_) return make_error("expert dispatch: a row count is out of range");
    total += counts[i];
  }
  if (total > max_rows_) return make_error("expert dispatch: more rows than the worker's limit");
  if (x_floats != static_cast<size_t>(total * H)) return make_error("expert dispatch: the rows have the wrong size");
  Backend& be = *backend_;
  const bool host = be.is_host_memory();
  if (host) {  // the message's rows in place, every expert's projections at once
    group_ffns_.clear();
    group_counts_.clear();
    for (size_t i = 0; i < experts.size(); ++i) {
      group_ffns_.push_back(&it->second.at(experts[i]));
      group_counts_.push_back(counts[i]);
    }
    run_ffn_group(be, group_ffns_.data(), group_counts_.data(), static_cast<int64_t>(group_ffns_.size()), x,
                  cfg_.moe.expert_ffn, H, gu_, act_, y);
    return be.sync();
  }
  int64_t off = 0;
  for (size_t i = 0; i < experts.size(); ++i) {  // a device backend: one expert's rows copied over at a time
    const int64_t cnt = counts[i];
    be.copy_in(x_, x + off * H, static_cast<size_t>(cnt * H));
    run_ffn(be, it->second.at(experts[i]), x_, cnt, cfg_.moe.expert_ffn, H, gu_, act_, y_);
    be.copy_out(y + off * H, y_, static_cast<size_t>(cnt * H));
    off += cnt;
  }
  return be.sync();
}

}  // namespace troupe
