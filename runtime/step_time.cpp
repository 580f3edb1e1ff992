#include "runtime/step_time.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe {

void StepTimeModel::observe(int32_t tokens, int32_t rows, double seconds) {
  if (tokens < 1 || rows < 0 || rows > tokens || !std::isfinite(seconds) || seconds <= 0) return;
  const double n = tokens, s = rows;
  auto add = [&](double& sum, double v) { sum = sum * decay_ + v; };
  add(w_, 1);
  add(n_, n);
  add(s_, s);
  add(nn_, n * n);
  add(ns_, n * s);
  add(ss_, s * s);
  add(t_, seconds);
  add(nt_, n * seconds);
  add(st_, s * seconds);
  // Sizes that hardly differ (every step full, at start-up) would extrapolate the fixed
  // term far outside them: the fit waits until they spread by a quarter of their mean.
  const double mean = n_ / w_;
  const double var = nn_ / w_ - mean * mean;
  if (var < 1.0 || var < 0.0625 * mean * mean) return;
  if (fit3() || fit2()) ready_ = true;
}

// Least squares on (1, n, s) through the centred normal equations.
bool StepTimeModel::fit3() {
  const double mn = n_ / w_, ms = s_ / w_, mt = t_ / w_;
  const double cnn = nn_ / w_ - mn * mn, cns = ns_ / w_ - mn * ms, css = ss_ / w_ - ms * ms;
  const double cnt = nt_ / w_ - mn * mt, cst = st_ / w_ - ms * mt;
  const double det = cnn * css - cns * cns;
  // Rows that move (nearly) in step with tokens cannot be priced apart from them.
  if (!(det > 1e-6 * cnn * css) || !(css >= 1.0)) return false;
  const double b = (cnt * css - cst * cns) / det, c = (cst * cnn - cnt * cns) / det;
  if (!(b > 0) || !(c >= 0) || !std::isfinite(b) || !std::isfinite(c)) return false;
  per_token_ = b;
  per_row_ = c;
  fixed_ = std::max(0.0, mt - b * mn - c * ms);
  return true;
}

// Least squares on (1, n): the rows' price folded into the others.
bool StepTimeModel::fit2() {
  const double mn = n_ / w_, mt = t_ / w_;
  const double cnn = nn_ / w_ - mn * mn, cnt = nt_ / w_ - mn * mt;
  const double b = cnt / cnn;
  if (!(b > 0) || !std::isfinite(b)) return false;  // noise swamped the sizes' effect
  per_token_ = b;
  per_row_ = 0;
  fixed_ = std::max(0.0, mt - b * mn);
  return true;
}

int32_t StepTimeModel::tokens_within(double seconds, int32_t rows) const {
  if (!ready_ || per_token_ <= 0) return std::numeric_limits<int32_t>::max();
  const double n = std::floor((seconds - fixed_ - per_row_ * rows) / per_token_);
  if (!(n >= 1)) return 1;
  return n >= static_cast<double>(std::numeric_limits<int32_t>::max()) ? std::numeric_limits<int32_t>::max()
                                                                        : static_cast<int32_t>(n);
}

}  // namespace troupe
