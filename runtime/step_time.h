// What a step costs, learned from the steps that ran:
//   seconds = fixed + per_token x tokens + per_row x sampled rows
// (a sampled row adds the logits matmul over the vocabulary and the sampler), fitted by
// least squares with older steps weighed down (each new step multiplies the weight of the
// ones before by `decay`). The scheduler uses it to keep a step that carries decoding
// sequences under an inter-token latency target (SchedulerConfig::itl_target_s).
// A plain class: the same observations give the same fit; the serving actor feeds it wall
// times, the simulator its cost model's.
#pragma once
#include <cstdint>

namespace troupe {

class StepTimeModel {
 public:
  explicit StepTimeModel(double decay = 0.97) : decay_(decay) {}
  // Ignores a step with no tokens, rows outside 0..tokens, or a time that is not a finite
  // positive number.
  void observe(int32_t tokens, int32_t rows, double seconds);
  // True once the steps seen differ enough in size to tell the terms apart (a spread of a
  // quarter of their mean size); until then, and while they stop differing, the last fit
  // stays. When the rows never vary apart from the tokens, their price is folded into the
  // others (per_row 0).
  bool ready() const { return ready_; }
  double fixed_seconds() const { return fixed_; }
  double seconds_per_token() const { return per_token_; }
  double seconds_per_row() const { return per_row_; }
  double predict(int32_t tokens, int32_t rows) const { return fixed_ + per_token_ * tokens + per_row_ * rows; }
  // The most tokens whose predicted step (with `rows` sampled rows) stays within `seconds`
  // (at least 1; the largest int32 while not ready).
  int32_t tokens_within(double seconds, int32_t rows) const;

 private:
  bool fit3();
  bool fit2();

  double decay_;
  // Weighted sums over the steps seen: w, n, s, n^2, n s, s^2, t, n t, s t.
  double w_ = 0, n_ = 0, s_ = 0, nn_ = 0, ns_ = 0, ss_ = 0, t_ = 0, nt_ = 0, st_ = 0;
  double fixed_ = 0, per_token_ = 0, per_row_ = 0;
  bool ready_ = false;
};

}  // namespace troupe
