#include "sim/step_log.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace troupe::sim {

std::string step_log_line(const std::vector<SeqShape>& seqs, double seconds, double compute_seconds) {
  char head[64];
  std::snprintf(head, sizeof head, "%.6f,%.6f,", seconds, compute_seconds);
  std::string line = head;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(seqs[i].num_computed) + "+" + std::to_string(seqs[i].num_new);
    if (seqs[i].samples) line += '*';
    if (seqs[i].samples && seqs[i].drafts > 0) line += std::to_string(seqs[i].drafts);  // (speculative drafts)
  }
  return line + "\n";
}

Result<std::vector<LoggedStep>> read_step_log(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error("cannot open step log '" + path + "'");
  std::string line;
  if (!std::getline(f, line) || line + "\n" != kStepLogHeader)
    return make_error(path + ": not a step log (the first line must be 'seconds,compute_seconds,seqs')");
  std::vector<LoggedStep> out;
  for (size_t no = 2; std::getline(f, line); ++no) {
    if (line.empty()) continue;
    auto bad = [&](const std::string& why) { return make_error(path + ":" + std::to_string(no) + ": " + why); };
    const size_t c1 = line.find(','), c2 = c1 == std::string::npos ? c1 : line.find(',', c1 + 1);
    if (c2 == std::string::npos) return bad("expected seconds,compute_seconds,seqs");
    LoggedStep s;
    char* end = nullptr;
    const std::string t = line.substr(0, c1), ct = line.substr(c1 + 1, c2 - c1 - 1);
    s.sample.seconds = std::strtod(t.c_str(), &end);
    if (t.empty() || *end || !std::isfinite(s.sample.seconds) || s.sample.seconds < 0) return bad("bad seconds");
    s.compute_seconds = std::strtod(ct.c_str(), &end);
    if (ct.empty() || *end || !std::isfinite(s.compute_seconds) || s.compute_seconds < 0)
      return bad("bad compute_seconds");
    std::istringstream seqs(line.substr(c2 + 1));
    std::string tok;
    while (seqs >> tok) {
      SeqShape q;
      // computed+new, '*' when sampled, then the speculative drafts among `new` if any
      if (const size_t star = tok.find('*'); star != std::string::npos) {
        q.samples = true;
        const std::string d = tok.substr(star + 1);
        tok.resize(star);
        if (!d.empty()) {
          long long n = -1;
          int used = 0;
          if (std::sscanf(d.c_str(), "%lld%n", &n, &used) != 1 || used != static_cast<int>(d.size()) || n < 1 ||
              n > 1024)
            return bad("bad draft count '" + d + "' (expected computed+new*drafts)");
          q.drafts = static_cast<int32_t>(n);
        }
      }
      long long a = -1, b = -1;
      int used = 0;
      if (std::sscanf(tok.c_str(), "%lld+%lld%n", &a, &b, &used) != 2 || used != static_cast<int>(tok.size()) ||
          a < 0 || b < 1 || a > (1 << 30) || b > (1 << 30))
        return bad("bad sequence '" + tok + "' (expected computed+new, new >= 1)");
      q.num_computed = static_cast<int32_t>(a);
      q.num_new = static_cast<int32_t>(b);
      if (q.drafts >= q.num_new) return bad("sequence '" + tok + "' has more drafts than new tokens");
      s.sample.seqs.push_back(q);
    }
    if (s.sample.seqs.empty()) return bad("a step with no sequences");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace troupe::sim
