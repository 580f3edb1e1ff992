#include <algorithm>

#include "runtime/model/moe.h"

namespace troupe {

void MoeStats::add_routing(int32_t layer, const int32_t* counts) {
  if (layer < 0 || layer >= layers_) return;
  int64_t total = 0, most = 0;
  for (int32_t e = 0; e < experts_; ++e) {
    total += counts[e];
    most = std::max<int64_t>(most, counts[e]);
  }
  const double ratio = total > 0 ? static_cast<double>(most) * experts_ / static_cast<double>(total) : 0.0;
  std::lock_guard<std::mutex> l(mu_);
  uint64_t* row = tokens_.data() + static_cast<size_t>(layer) * experts_;
  for (int32_t e = 0; e < experts_; ++e) row[e] += static_cast<uint64_t>(counts[e]);
  if (total == 0) return;
  ++s_.layer_steps;
  s_.imbalance_sum += ratio;
  s_.imbalance_max = std::max(s_.imbalance_max, ratio);
}

void MoeStats::add_dispatch(double dispatch_s, double compute_s, uint64_t bytes_out, uint64_t bytes_in,
                            double worker_ratio) {
  std::lock_guard<std::mutex> l(mu_);
  ++s_.dispatches;
  s_.dispatch_seconds += dispatch_s;
  s_.worker_compute_seconds += compute_s;
  s_.dispatch_bytes += bytes_out;
  s_.combine_bytes += bytes_in;
  s_.worker_ratio_sum += worker_ratio;
  s_.worker_ratio_max = std::max(s_.worker_ratio_max, worker_ratio);
}

void MoeStats::add_combine(double s) {
  std::lock_guard<std::mutex> l(mu_);
  s_.combine_seconds += s;
}

MoeStats::Snapshot MoeStats::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  Snapshot r = s_;
  r.num_layers = layers_;
  r.num_experts = experts_;
  r.tokens = tokens_;
  return r;
}

}  // namespace troupe
