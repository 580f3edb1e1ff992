// A small SVG line chart (no dependencies) for `troupe sim sweep`: labelled axes, one
// polyline per series, a legend. Opens in any browser.
#pragma once
#include <string>
#include <vector>

namespace troupe::sim {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<Series>& series, bool log_y);

}  // namespace troupe::sim
