// Mixture-of-experts hooks of the forward pass: where a layer's routed experts run
// (ExpertDispatcher: expert parallelism hands them to expert workers, actors/expert_actor.h)
// and what the routing did (MoeStats, the server's troupe:moe_* metrics).
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/result.h"

namespace troupe {

// One MoE layer's routed work in one step, expert-major on the host: expert e's rows are
// x[offsets[e] .. offsets[e + 1]) (tokens ascending); y gets the expert outputs in the
// same rows. Each expert must run once over all its rows, as Model does locally, so the
// bits are the same wherever it runs.
struct ExpertWork {
  int32_t layer = 0;  // the model's layer index
  int32_t num_experts = 0;
  int64_t hidden = 0;
  const int32_t* offsets = nullptr;  // [num_experts + 1]
  const float* x = nullptr;          // [offsets[num_experts], hidden]
  float* y = nullptr;                // [offsets[num_experts], hidden]
};

class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  // Runs every expert with rows; an error fails the step (the error names the worker).
  virtual Status run(const ExpertWork& w) = 0;
};

// What routing did, summed since start; shared by every stage of a process (their layers
// differ) and read by the metrics endpoint. Thread-safe.
class MoeStats {
 public:
  MoeStats(int32_t num_layers, int32_t num_experts)
      : layers_(num_layers), experts_(num_experts), tokens_(static_cast<size_t>(num_layers) * num_experts, 0) {}
  int32_t num_layers() const { return layers_; }
  int32_t num_experts() const { return experts_; }

  // One layer-step's routing: rows per expert ([num_experts]).
  void add_routing(int32_t layer, const int32_t* counts);
  // One expert-parallel dispatch (all workers of one layer-step): wall time of the round trip,
  // the workers' compute summed, the host's combine, payload bytes both ways and the
  // worker load ratio (the most rows on one worker over the mean).
  void add_dispatch(double dispatch_s, double compute_s, uint64_t bytes_out, uint64_t bytes_in, double worker_ratio);
  void add_combine(double s);

  struct Snapshot {
    int32_t num_layers = 0, num_experts = 0;
    std::vector<uint64_t> tokens;  // [layer * num_experts + expert]
    uint64_t layer_steps = 0;
    double imbalance_sum = 0, imbalance_max = 0;  // max/mean rows per expert, per layer-step
    uint64_t dispatches = 0;
    double dispatch_seconds = 0, worker_compute_seconds = 0, combine_seconds = 0;
    uint64_t dispatch_bytes = 0, combine_bytes = 0;
    double worker_ratio_sum = 0, worker_ratio_max = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  int32_t layers_, experts_;
  std::vector<uint64_t> tokens_;
  Snapshot s_;
};

}  // namespace troupe
