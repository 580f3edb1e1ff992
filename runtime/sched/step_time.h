// What a step costs, learned from the steps that ran:
//   seconds = fixed + per_token x tokens + per_row x sampled rows + per_pair x attention pairs
// (a sampled row adds the logits matmul over the vocabulary and the sampler; the attention
// pairs are the (query, key) pairs the step's attention visits, which grow with the
// context: a chunk late in a long prompt costs more than one at its start), fitted by least
// squares with older steps weighed down (each new step multiplies the weight of the ones
// before by `decay`). The scheduler uses it to keep a step that carries decoding sequences
// under an inter-token latency target (SchedulerConfig::itl_target_s).
// A plain class: the same observations give the same fit; the serving actor feeds it wall
// times, the simulator its cost model's.
#pragma once
#include <array>
#include <cstdint>

namespace troupe {

// A step's shape as the model prices it.
struct StepShape {
  double tokens = 0, rows = 0, pairs = 0;
};

class StepTimeModel {
 public:
  explicit StepTimeModel(double decay = 0.97) : decay_(decay) {}
  // Ignores a step with no tokens, rows outside 0..tokens, negative pairs, or a time that
  // is not a finite positive number. Once fitted, a step counts as at most kClip times its
  // predicted time: a stall of the machine (on the 2-core VMs a vCPU the host deschedules
  // for about 100 ms while the guest has more runnable threads than cores) would otherwise
  // pull every price up for dozens of steps, and the latency target's floor of three
  // decode-only steps with them. A lasting slowdown is still learned, by at most kClip a step.
  void observe(const StepShape& shape, double seconds);
  static constexpr double kClip = 1.5;
  // True once the steps seen differ enough in size to tell the terms apart (a spread of a
  // quarter of their mean size); until then, and while they stop differing, the last fit
  // stays. A term the steps cannot price apart from the others (rows that never vary, or a
  // price that comes out negative) is left out of the fit: its price is 0.
  bool ready() const { return ready_; }
  double fixed_seconds() const { return coef_[0]; }
  double seconds_per_token() const { return coef_[1]; }
  double seconds_per_row() const { return coef_[2]; }
  double seconds_per_pair() const { return coef_[3]; }
  double predict(const StepShape& s) const {
    return coef_[0] + coef_[1] * s.tokens + coef_[2] * s.rows + coef_[3] * s.pairs;
  }

 private:
  static constexpr int kTerms = 4;  // 1, tokens, rows, pairs
  bool fit(unsigned mask);

  double decay_;
  // Decayed weighted sums of x x^T and x t, x = (1, tokens, rows, pairs).
  std::array<std::array<double, kTerms>, kTerms> xx_{};
  std::array<double, kTerms> xt_{};
  std::array<double, kTerms> coef_{};
  bool ready_ = false;
};

}  // namespace troupe
