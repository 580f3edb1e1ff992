// `troupe sim calibrate`: fits a hardware profile's efficiency factors and per-step and
// per-sample overheads to step times measured on the real engine, so the cost model
// predicts what this machine does. The fit is pure (no clocks): samples in, profile out.
#pragma once
#include <string>
#include <vector>

#include "sim/cost_model.h"

namespace troupe::sim {

// One measured engine step: the shapes the scheduler planned and the seconds it took.
struct StepSample {
  std::vector<SeqShape> seqs;
  double seconds = 0;
};

struct FitReport {
  HardwareProfile profile;      // the base profile with the fitted fields replaced
  double median_abs_error = 0;  // |predicted / measured - 1| over the samples
  double p90_abs_error = 0;
  double max_abs_error = 0;
  size_t samples = 0;
};

// Fits flops_efficiency, attention_efficiency, bw_efficiency, kv_bw_efficiency,
// step_overhead_s, sample_overhead_s and whether compute and memory overlap (peak rates, byte
// sizes and the name come from `base`) by minimising the squared log error of the predicted
// step times (Nelder-Mead from several starts; deterministic). Needs at least 5 samples with positive times.
Result<FitReport> fit_profile(const ModelConfig& model, const HardwareProfile& base,
                              const std::vector<StepSample>& samples);

// The q-quantile of v (nearest rank; 0 when empty).
double quantile(std::vector<double> v, double q);

// Relative errors |predicted / measured - 1| of a profile on samples.
std::vector<double> relative_errors(const ModelConfig& model, const HardwareProfile& hw,
                                    const std::vector<StepSample>& samples, const Layout& layout = {});

// Expert workers' hand-off: with `base` (a profile fitted on the same model without expert
// workers) held, fits its expert_hop_s and expert_row_s to steps measured with
// `layout.expert_workers` workers: what the steps took beyond the base's prediction, per MoE
// layer, as a constant plus a cost per routed row (least squares on the relative error,
// both >= 0). The predictions use the base's engine overheads (the steps are engine steps);
// the returned profile keeps the base's serving overheads. Needs 5 samples.
Result<FitReport> fit_expert_handoff(const ModelConfig& model, const HardwareProfile& base, const Layout& layout,
                                     const std::vector<StepSample>& samples);

// `hw` with its overheads replaced by the engine's alone (engine_step/sample_overhead_s).
HardwareProfile engine_only(HardwareProfile hw);

}  // namespace troupe::sim
