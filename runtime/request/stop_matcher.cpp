#include "runtime/request/stop_matcher.h"

#include <algorithm>

namespace troupe {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

size_t StopMatcher::holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  }
  return hold;
}

StopMatcher::Out StopMatcher::push(std::string_view piece, bool final_piece) {
  Out out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  held_ += piece;
  // Only the held text can hold a stop string: what was sent had no suffix that starts one.
  size_t stop_at = std::string::npos;
  for (const auto& s : stops_) stop_at = std::min(stop_at, held_.find(s));
  if (stop_at != std::string::npos) {
    out.text = held_.substr(0, stop_at);
    out.stopped = stopped_ = true;
    held_.clear();
    return out;
  }
  const size_t hold = final_piece ? 0 : holdback(held_, stops_);
  out.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

}  // namespace troupe
