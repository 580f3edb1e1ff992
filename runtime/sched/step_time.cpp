#include "runtime/sched/step_time.h"

#include <algorithm>
#include <cmath>

namespace troupe {

void StepTimeModel::observe(const StepShape& shape, double seconds) {
  if (!(shape.tokens >= 1) || !(shape.rows >= 0) || shape.rows > shape.tokens || !(shape.pairs >= 0) ||
      !std::isfinite(shape.pairs) || !std::isfinite(shape.tokens) || !std::isfinite(seconds) || seconds <= 0)
    return;
  if (const double p = predict(shape); ready_ && p > 0) seconds = std::min(seconds, kClip * p);
  const std::array<double, kTerms> x = {1, shape.tokens, shape.rows, shape.pairs};
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) xx_[i][j] = xx_[i][j] * decay_ + x[i] * x[j];
    xt_[i] = xt_[i] * decay_ + x[i] * seconds;
  }
  // Sizes that hardly differ (every step full, at start-up) would extrapolate the fixed
  // term far outside them: the fit waits until they spread by a quarter of their mean.
  const double w = xx_[0][0], mean = xx_[0][1] / w;
  const double var = xx_[1][1] / w - mean * mean;
  if (var < 1.0 || var < 0.0625 * mean * mean) return;
  // The fullest fit whose prices are all positive (tokens) or not negative (the others).
  for (unsigned mask : {0xFu, 0xBu, 0x7u, 0x3u})
    if (fit(mask)) {
      ready_ = true;
      return;
    }
}

// Least squares on the terms in `mask` (bit i: term i; the fixed term and tokens always),
// through the centred normal equations solved by Gaussian elimination with pivoting.
bool StepTimeModel::fit(unsigned mask) {
  const double w = xx_[0][0];
  int idx[kTerms - 1];
  int m = 0;
  for (int i = 1; i < kTerms; ++i)
    if (mask & (1u << i)) idx[m++] = i;
  double a[kTerms - 1][kTerms] = {};  // m x (m + 1) augmented covariance system
  for (int r = 0; r < m; ++r) {
    const int i = idx[r];
    for (int c = 0; c < m; ++c) {
      const int j = idx[c];
      a[r][c] = xx_[i][j] / w - (xx_[0][i] / w) * (xx_[0][j] / w);
    }
    a[r][m] = xt_[i] / w - (xx_[0][i] / w) * (xt_[0] / w);
  }
  double scale[kTerms - 1];
  for (int r = 0; r < m; ++r) {
    scale[r] = a[r][r];
    if (!(scale[r] > 0)) return false;  // a term that never varies
  }
  for (int col = 0; col < m; ++col) {
    int piv = col;
    for (int r = col + 1; r < m; ++r)
      if (std::abs(a[r][col]) > std::abs(a[piv][col])) piv = r;
    for (int c = 0; c <= m; ++c) std::swap(a[col][c], a[piv][c]);
    // A pivot that is a tiny part of its term's variance: the term moves with the others.
    if (!(std::abs(a[col][col]) > 1e-9 * scale[col])) return false;
    for (int r = 0; r < m; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int c = col; c <= m; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::array<double, kTerms> coef{};
  double fixed = xt_[0] / w;
  for (int r = 0; r < m; ++r) {
    const double c = a[r][m] / a[r][r];
    if (!std::isfinite(c) || c < 0 || (idx[r] == 1 && !(c > 0))) return false;
    coef[idx[r]] = c;
    fixed -= c * (xx_[0][idx[r]] / w);
  }
  coef[0] = std::max(0.0, fixed);
  coef_ = coef;
  return true;
}

}  // namespace troupe
