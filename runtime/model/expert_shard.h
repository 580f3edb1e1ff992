// An expert worker's weights: some routed experts of some MoE layers, built from the same
// model file with the same code as Model's (ffn.h), and run over the rows a stage sends.
// Each expert runs once over all its rows, as in Model::run_moe, so its output rows are
// bit-identical to the ones a single process computes.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "runtime/model/ffn.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model.h"

namespace troupe {

class ExpertShard {
 public:
  // experts: layer -> the expert ids this shard holds (each in range, no repeats).
  // max_rows: the most rows one dispatch may carry (a step's tokens times experts_per_tok).
  static Result<std::unique_ptr<ExpertShard>> build(const ModelConfig& cfg, const WeightSource& src, Backend& backend,
                                                    int32_t max_rows,
                                                    const std::map<int32_t, std::vector<int32_t>>& experts,
                                                    const ProgressFn& progress = {});

  // Runs experts[i] over counts[i] consecutive rows of x [sum counts, hidden] into y (host
  // memory, same shape). Checks the layer, the experts and the sizes first.
  Status run(int32_t layer, const std::vector<int32_t>& experts, const std::vector<int32_t>& counts, const float* x,
             size_t x_floats, float* y);
  bool holds(int32_t layer, int32_t expert) const;
  int32_t max_rows() const { return max_rows_; }
  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return *backend_; }

 private:
  ModelConfig cfg_;
  Backend* backend_ = nullptr;
  int32_t max_rows_ = 0;
  std::map<int32_t, std::map<int32_t, Ffn>> ffn_;  // layer -> expert -> weights
  std::vector<const Ffn*> group_ffns_;             // run()'s scratch: a dispatch's experts and rows
  std::vector<int64_t> group_counts_;
  float *x_ = nullptr, *y_ = nullptr, *gu_ = nullptr, *act_ = nullptr;
};

}  // namespace troupe
