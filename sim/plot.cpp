#include "sim/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace troupe::sim {
namespace {
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}
}  // namespace

std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series, bool log_y) {
  const double W = 760, H = 460, L = 80, R = 200, T = 40, B = 60;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (log_y && !(s.y[i] > 0)) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      const double y = log_y ? std::log10(s.y[i]) : s.y[i];
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (!log_y) y0 = std::min(0.0, y0);
  if (y1 == y0) y1 = y0 + 1;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                 "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  std::string o =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + num(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + esc(title) + "</text>\n";
  o += "<line x1=\"" + num(L) + "\" y1=\"" + num(H - B) + "\" x2=\"" + num(W - R) + "\" y2=\"" + num(H - B) +
       "\" stroke=\"black\"/>\n";
  o += "<line x1=\"" + num(L) + "\" y1=\"" + num(T) + "\" x2=\"" + num(L) + "\" y2=\"" + num(H - B) +
       "\" stroke=\"black\"/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double xv = x0 + (x1 - x0) * i / 5, yv = y0 + (y1 - y0) * i / 5;
    o +=
        "<text x=\"" + num(px(xv)) + "\" y=\"" + num(H - B + 18) + "\" text-anchor=\"middle\">" + num(xv) + "</text>\n";
    o += "<text x=\"" + num(L - 6) + "\" y=\"" + num(py(yv) + 4) + "\" text-anchor=\"end\">" +
         num(log_y ? std::pow(10.0, yv) : yv) + "</text>\n";
    o += "<line x1=\"" + num(L) + "\" y1=\"" + num(py(yv)) + "\" x2=\"" + num(W - R) + "\" y2=\"" + num(py(yv)) +
         "\" stroke=\"#ddd\"/>\n";
  }
  o += "<text x=\"" + num((L + W - R) / 2) + "\" y=\"" + num(H - 15) + "\" text-anchor=\"middle\">" + esc(x_label) +
       "</text>\n";
  o += "<text transform=\"translate(18," + num((T + H - B) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       esc(y_label + (log_y ? " (log scale)" : "")) + "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const std::string c = colors[k % 8];
    std::string pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (log_y && !(s.y[i] > 0)) continue;
      const double y = log_y ? std::log10(s.y[i]) : s.y[i];
      pts += num(px(s.x[i])) + "," + num(py(y)) + " ";
      o += "<circle cx=\"" + num(px(s.x[i])) + "\" cy=\"" + num(py(y)) + "\" r=\"3\" fill=\"" + c + "\"/>\n";
    }
    o += "<polyline fill=\"none\" stroke=\"" + c + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    const double ly = T + 10 + 20.0 * k;
    o += "<line x1=\"" + num(W - R + 15) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(W - R + 40) + "\" y2=\"" + num(ly) +
         "\" stroke=\"" + c + "\" stroke-width=\"2\"/>\n";
    o += "<text x=\"" + num(W - R + 46) + "\" y=\"" + num(ly + 4) + "\">" + esc(s.label) + "</text>\n";
  }
  return o + "</svg>\n";
}

}  // namespace troupe::sim
