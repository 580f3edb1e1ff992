#include "sim/calibrate.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace troupe::sim {
namespace {

constexpr int kDims = 7;
// logs of: fe, ae, be, kv be, step overhead, sample overhead, expert launch (MoE models)
using Point = std::array<double, kDims>;

HardwareProfile with_params(HardwareProfile p, const Point& x) {
  p.flops_efficiency = std::exp(x[0]);
  p.attention_efficiency = std::exp(x[1]);
  p.bw_efficiency = std::exp(x[2]);
  p.kv_bw_efficiency = std::exp(x[3]);
  p.step_overhead_s = std::exp(x[4]);
  p.sample_overhead_s = std::exp(x[5]);
  p.expert_launch_s = std::exp(x[6]);
  p.engine_step_overhead_s = p.step_overhead_s;  // what the samples measured
  p.engine_sample_overhead_s = p.sample_overhead_s;
  return p;
}

// Efficiencies stay in (0, 1.5] and overheads in [1 ns, 10 s]: outside is a bad fit, not physics.
Point clamp(Point x) {
  for (int i = 0; i < 4; ++i) x[i] = std::clamp(x[i], std::log(1e-5), std::log(1.5));
  for (int i = 4; i < 7; ++i) x[i] = std::clamp(x[i], std::log(1e-9), std::log(10.0));
  return x;
}

}  // namespace

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(std::floor(q * (v.size() - 1) + 0.5)))];
}

std::vector<double> relative_errors(const ModelConfig& model, const HardwareProfile& hw,
                                    const std::vector<StepSample>& samples, const Layout& layout) {
  const CostModel cm(model, hw, layout);
  std::vector<double> e;
  e.reserve(samples.size());
  for (const auto& s : samples) e.push_back(std::fabs(cm.step_seconds(s.seqs) / s.seconds - 1));
  return e;
}

Result<FitReport> fit_profile(const ModelConfig& model, const HardwareProfile& base,
                              const std::vector<StepSample>& samples) {
  if (samples.size() < 5)
    return make_error("calibration needs at least 5 measured steps, got " + std::to_string(samples.size()));
  for (const auto& s : samples)
    if (!(s.seconds > 0) || !std::isfinite(s.seconds) || s.seqs.empty())
      return make_error("calibration samples need a positive time and at least one sequence");
  bool base_overlap = true;
  auto loss = [&](const Point& x) {
    HardwareProfile p = with_params(base, clamp(x));
    p.overlap = base_overlap;
    const CostModel cm(model, p);
    double sum = 0;
    for (const auto& s : samples) {
      const double r = std::log(cm.step_seconds(s.seqs) / s.seconds);
      sum += r * r;
    }
    return sum / samples.size();
  };
  // Nelder-Mead from a few starts spread over the efficiencies and overheads, with and
  // without compute/memory overlap; the lowest loss wins.
  Point best{};
  double best_loss = INFINITY;
  bool best_overlap = true;
  for (bool overlap : {true, false})
    for (double e0 : {0.05, 0.3, 0.8}) {
      for (double o0 : {1e-5, 1e-3}) {
        base_overlap = overlap;
        Point start{std::log(e0), std::log(e0),      std::log(e0),     std::log(e0),
                    std::log(o0), std::log(o0 / 10), std::log(o0 / 10)};
        std::array<Point, kDims + 1> simplex;
        std::array<double, kDims + 1> f;
        for (int i = 0; i <= kDims; ++i) {
          simplex[i] = start;
          if (i) simplex[i][i - 1] += 1.0;
          f[i] = loss(simplex[i]);
        }
        for (int iter = 0; iter < 3000; ++iter) {
          std::array<int, kDims + 1> order;
          for (int i = 0; i <= kDims; ++i) order[i] = i;
          std::sort(order.begin(), order.end(), [&](int a, int b) { return f[a] < f[b]; });
          const int lo = order[0], hi = order[kDims], second = order[kDims - 1];
          if (std::fabs(f[hi] - f[lo]) < 1e-12 * (1 + std::fabs(f[lo])) && iter > 50) break;
          Point c{};
          for (int i = 0; i <= kDims; ++i)
            if (i != hi)
              for (int d = 0; d < kDims; ++d) c[d] += simplex[i][d] / kDims;
          auto along = [&](double t) {
            Point p;
            for (int d = 0; d < kDims; ++d) p[d] = c[d] + t * (simplex[hi][d] - c[d]);
            return p;
          };
          const Point xr = along(-1.0);
          const double fr = loss(xr);
          if (fr < f[lo]) {
            const Point xe = along(-2.0);
            const double fe = loss(xe);
            if (fe < fr) {
              simplex[hi] = xe;
              f[hi] = fe;
            } else {
              simplex[hi] = xr;
              f[hi] = fr;
            }
          } else if (fr < f[second]) {
            simplex[hi] = xr;
            f[hi] = fr;
          } else {
            const Point xc = fr < f[hi] ? along(-0.5) : along(0.5);
            const double fc = loss(xc);
            if (fc < std::min(fr, f[hi])) {
              simplex[hi] = xc;
              f[hi] = fc;
            } else {  // shrink toward the best
              for (int i = 0; i <= kDims; ++i) {
                if (i == lo) continue;
                for (int d = 0; d < kDims; ++d) simplex[i][d] = simplex[lo][d] + 0.5 * (simplex[i][d] - simplex[lo][d]);
                f[i] = loss(simplex[i]);
              }
            }
          }
        }
        for (int i = 0; i <= kDims; ++i)
          if (f[i] < best_loss) {
            best_loss = f[i];
            best = simplex[i];
            best_overlap = overlap;
          }
      }
    }
  FitReport rep;
  rep.profile = with_params(base, clamp(best));
  rep.profile.overlap = best_overlap;
  if (!model.moe.enabled()) rep.profile.expert_launch_s = 0;  // (no effect on a dense model's fit)
  const auto e = relative_errors(model, rep.profile, samples);
  rep.samples = samples.size();
  rep.median_abs_error = quantile(e, 0.5);
  rep.p90_abs_error = quantile(e, 0.9);
  rep.max_abs_error = *std::max_element(e.begin(), e.end());
  return rep;
}

}  // namespace troupe::sim

namespace troupe::sim {

HardwareProfile engine_only(HardwareProfile hw) {
  if (hw.engine_step_overhead_s >= 0) hw.step_overhead_s = hw.engine_step_overhead_s;
  if (hw.engine_sample_overhead_s >= 0) hw.sample_overhead_s = hw.engine_sample_overhead_s;
  return hw;
}

Result<FitReport> fit_expert_handoff(const ModelConfig& model, const HardwareProfile& base, const Layout& layout,
                                     const std::vector<StepSample>& samples) {
  if (layout.expert_workers < 1) return make_error("fitting the expert hand-off needs expert workers in the layout");
  TROUPE_TRY(check_layout(layout, model));
  if (samples.size() < 5)
    return make_error("calibration needs at least 5 measured steps, got " + std::to_string(samples.size()));
  for (const auto& s : samples)
    if (!(s.seconds > 0) || !std::isfinite(s.seconds) || s.seqs.empty())
      return make_error("calibration samples need a positive time and at least one sequence");
  HardwareProfile zero = engine_only(base);
  zero.expert_hop_s = zero.expert_row_s = 0;
  const CostModel cm(model, zero, layout);
  const double L = model.num_layers, k = cm.layout().experts_per_token;
  // Weighted least squares of (measured - predicted) = L hop + L rows row_s, weights
  // 1 / measured^2 (relative error); a negative coefficient is pinned at 0 and the other refitted.
  double saa = 0, sab = 0, sbb = 0, say = 0, sby = 0;
  for (const auto& s : samples) {
    double tokens = 0;
    for (const auto& q : s.seqs) tokens += q.num_new;
    const double w = 1 / (s.seconds * s.seconds), a = L, b = L * tokens * k, y = s.seconds - cm.step_seconds(s.seqs);
    saa += w * a * a;
    sab += w * a * b;
    sbb += w * b * b;
    say += w * a * y;
    sby += w * b * y;
  }
  const double det = saa * sbb - sab * sab;
  double hop = det > 0 ? (say * sbb - sby * sab) / det : say / saa;
  double row = det > 0 ? (sby * saa - say * sab) / det : 0;
  if (hop < 0) {
    hop = 0;
    row = sbb > 0 ? std::max(0.0, sby / sbb) : 0;
  }
  if (row < 0) {
    row = 0;
    hop = std::max(0.0, say / saa);
  }
  FitReport rep;
  rep.profile = base;
  rep.profile.expert_hop_s = hop;
  rep.profile.expert_row_s = row;
  const auto e = relative_errors(model, engine_only(rep.profile), samples, layout);
  rep.samples = samples.size();
  rep.median_abs_error = quantile(e, 0.5);
  rep.p90_abs_error = quantile(e, 0.9);
  rep.max_abs_error = *std::max_element(e.begin(), e.end());
  return rep;
}

}  // namespace troupe::sim
