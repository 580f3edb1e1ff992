#include "sim/workload.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace troupe::sim {
namespace {

int32_t draw(const LengthDist& d, std::mt19937_64& rng) {
  double v = d.a;
  if (d.kind == "uniform") {
    v = std::uniform_real_distribution<double>(d.a, d.b + 1)(rng);
  } else if (d.kind == "lognormal") {
    v = std::lognormal_distribution<double>(d.a, d.b)(rng);
  } else if (d.kind == "empirical" && !d.samples.empty()) {
    v = d.samples[std::uniform_int_distribution<size_t>(0, d.samples.size() - 1)(rng)];
  }
  return static_cast<int32_t>(std::clamp(std::floor(v), 1.0, 1e7));
}

Result<double> number(const std::string& s, const std::string& what) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v)) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) { return make_error(what + ": '" + s + "' is not a number"); }
}

// "2023-11-16 18:15:46.6805900" (Azure LLM inference traces) -> seconds since 1970.
Result<double> azure_time(const std::string& t, const std::string& where) {
  int y, mo, d, h, mi;
  double sec;
  if (std::sscanf(t.c_str(), "%d-%d-%d %d:%d:%lf", &y, &mo, &d, &h, &mi, &sec) != 6 || mo < 1 || mo > 12 || d < 1 ||
      d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || !(sec >= 0 && sec < 61))
    return make_error(where + ": TIMESTAMP '" + t + "' is not YYYY-MM-DD HH:MM:SS.fff");
  // Days from the civil date (Howard Hinnant's algorithm).
  const int yy = y - (mo <= 2);
  const int era = (yy >= 0 ? yy : yy - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(yy - era * 400);
  const unsigned doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const double days = era * 146097.0 + doe - 719468.0;
  return days * 86400.0 + h * 3600.0 + mi * 60.0 + sec;
}

Status check_request(const SimRequest& r, const std::string& where) {
  if (!(r.arrival_s >= 0)) return make_error(where + ": arrival_s must be >= 0");
  if (r.prompt_tokens < 1 || r.output_tokens < 1)
    return make_error(where + ": prompt_tokens and output_tokens must be >= 1");
  if (r.prefix_group >= 0 && r.prefix_tokens > r.prompt_tokens)
    return make_error(where + ": prefix_tokens exceeds prompt_tokens");
  return {};
}

}  // namespace

Result<LengthDist> parse_length(const std::string& text, bool output) {
  if (text.rfind("trace:", 0) == 0) {
    auto t = read_trace(text.substr(6));
    if (!t) return t.error();
    if (t->empty()) return make_error("length distribution '" + text + "': the trace has no requests");
    LengthDist d;
    d.kind = "empirical";
    for (const auto& r : *t) d.samples.push_back(output ? r.output_tokens : r.prompt_tokens);
    return d;
  }
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  LengthDist d;
  if (parts.empty()) return make_error("empty length distribution");
  d.kind = parts[0];
  const size_t want = d.kind == "fixed" ? 2 : (d.kind == "uniform" || d.kind == "lognormal") ? 3 : 0;
  if (!want || parts.size() != want)
    return make_error("length distribution '" + text +
                      "': expected fixed:N, uniform:A:B, lognormal:MU:SIGMA or trace:FILE");
  auto a = number(parts[1], text);
  if (!a) return a.error();
  d.a = *a;
  if (want == 3) {
    auto b = number(parts[2], text);
    if (!b) return b.error();
    d.b = *b;
  }
  if (d.kind != "lognormal" && (d.a < 1 || (d.kind == "uniform" && d.b < d.a)))
    return make_error("length distribution '" + text + "' is empty or below 1");
  if (d.kind == "lognormal" && !(d.b >= 0)) return make_error("lognormal sigma must be >= 0");
  return d;
}

Result<std::vector<SimRequest>> synthetic(const SyntheticSpec& s) {
  if (s.num_requests < 0 || s.num_requests > 100'000'000) return make_error("--requests must be 0..100000000");
  if (!(s.rate > 0)) return make_error("--rate must be > 0");
  if (!(s.cv > 0)) return make_error("--cv must be > 0");
  std::mt19937_64 rng(s.seed);
  // Gamma inter-arrivals with mean 1/rate and the chosen CV (shape 1/cv^2); cv 1 is Poisson.
  const double shape = 1.0 / (s.cv * s.cv);
  std::gamma_distribution<double> gap(shape, 1.0 / (s.rate * shape));
  if (s.priority_levels < 1 || s.priority_levels > 1000) return make_error("--priority-levels must be 1..1000");
  std::uniform_int_distribution<int32_t> group(0, std::max(0, s.num_prefix_groups - 1));
  std::uniform_int_distribution<int32_t> prio(0, s.priority_levels - 1);
  std::vector<SimRequest> out;
  out.reserve(static_cast<size_t>(s.num_requests));
  double t = 0;
  for (int64_t i = 0; i < s.num_requests; ++i) {
    t += gap(rng);
    SimRequest r;
    r.id = i;
    r.arrival_s = t;
    r.prompt_tokens = draw(s.prompt, rng);
    r.output_tokens = draw(s.output, rng);
    if (s.priority_levels > 1) r.priority = prio(rng);
    if (s.num_prefix_groups > 0) {
      r.prefix_group = group(rng);
      r.prefix_tokens = std::min(s.prefix_tokens, r.prompt_tokens);
    }
    out.push_back(r);
  }
  return out;
}

int32_t estimate_tokens(std::string_view text) {
  return static_cast<int32_t>(std::max<size_t>(1, (text.size() + 3) / 4));
}

Result<std::vector<SimRequest>> read_sharegpt(const std::string& path, const TokenCounter& count,
                                              const SyntheticSpec& arrivals) {
  std::ifstream f(path);
  if (!f) return make_error("cannot open ShareGPT file '" + path + "'");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return make_error(path + ": not a JSON array of conversations");
  SyntheticSpec times = arrivals;
  times.num_requests = static_cast<int64_t>(j.size());
  times.prompt = times.output = LengthDist{};
  times.num_prefix_groups = 0;
  times.priority_levels = 1;
  auto when = synthetic(times);
  if (!when) return when.error();
  std::vector<SimRequest> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (arrivals.num_requests > 0 && static_cast<int64_t>(out.size()) >= arrivals.num_requests) break;
    const auto& c = j[i];
    if (!c.is_object() || !c.contains("conversations") || !c["conversations"].is_array()) continue;
    const auto& turns = c["conversations"];
    for (size_t k = 0; k + 1 < turns.size(); ++k) {
      const auto& a = turns[k];
      const auto& b = turns[k + 1];
      auto is = [](const nlohmann::json& t, const char* from) {
        const auto f = t.find("from");
        const auto v = t.find("value");
        return f != t.end() && f->is_string() && *f == from && v != t.end() && v->is_string();
      };
      if (!a.is_object() || !b.is_object() || !is(a, "human") || !is(b, "gpt")) continue;
      SimRequest r;
      r.arrival_s = (*when)[out.size()].arrival_s;
      r.prompt_tokens = std::max<int32_t>(1, count(a["value"].get<std::string>()));
      r.output_tokens = std::max<int32_t>(1, count(b["value"].get<std::string>()));
      r.id = static_cast<int64_t>(out.size());
      out.push_back(r);
      break;
    }
  }
  if (out.empty()) return make_error(path + ": no conversation has a human turn followed by a gpt turn");
  return out;
}

Result<std::vector<SimRequest>> read_trace(const std::string& path) {
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".json") {
    SyntheticSpec arrivals;
    arrivals.num_requests = 0;
    return read_sharegpt(path, estimate_tokens, arrivals);
  }
  std::ifstream f(path);
  if (!f) return make_error("cannot open trace '" + path + "'");
  std::vector<SimRequest> out;
  const bool jsonl = path.size() >= 6 && path.substr(path.size() - 6) == ".jsonl";
  std::string line;
  size_t line_no = 0;
  std::map<std::string, size_t> col;
  bool azure = false;
  while (std::getline(f, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = path + ":" + std::to_string(line_no);
    SimRequest r;
    if (jsonl) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return make_error(where + ": not a JSON object");
      try {
        r.arrival_s = j.at("arrival_s").get<double>();
        r.prompt_tokens = j.at("prompt_tokens").get<int32_t>();
        r.output_tokens = j.at("output_tokens").get<int32_t>();
        r.priority = j.value("priority", 0);
        r.prefix_group = j.value("prefix_group", -1);
        r.prefix_tokens = j.value("prefix_tokens", 0);
      } catch (const std::exception& e) { return make_error(where + ": " + e.what()); }
    } else {
      std::vector<std::string> cells;
      std::stringstream ss(line);
      for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
      if (col.empty()) {  // the header
        for (size_t i = 0; i < cells.size(); ++i) col[cells[i]] = i;
        azure = col.count("TIMESTAMP") && col.count("ContextTokens") && col.count("GeneratedTokens");
        if (!azure)
          for (const char* need : {"arrival_s", "prompt_tokens", "output_tokens"})
            if (!col.count(need))
              return make_error(path + ": the CSV header has no '" + need +
                                "' column (nor TIMESTAMP,ContextTokens,GeneratedTokens of an Azure trace)");
        continue;
      }
      if (azure) {  // Azure LLM inference trace (2023 and 2024 releases share these columns)
        if (cells.size() < col.size()) return make_error(where + ": missing columns");
        auto t = azure_time(cells[col["TIMESTAMP"]], where);
        if (!t) return t.error();
        auto in = number(cells[col["ContextTokens"]], where + " ContextTokens");
        auto outk = number(cells[col["GeneratedTokens"]], where + " GeneratedTokens");
        if (!in) return in.error();
        if (!outk) return outk.error();
        if (*in > 1e8 || *outk > 1e8) return make_error(where + ": token counts out of range");
        r.arrival_s = *t;
        r.prompt_tokens = static_cast<int32_t>(*in);
        r.output_tokens = std::max<int32_t>(1, static_cast<int32_t>(*outk));  // a few rows record 0
        TROUPE_TRY(check_request(r, where));
        out.push_back(r);
        continue;
      }
      auto get = [&](const char* name, double dflt) -> Result<double> {
        auto it = col.find(name);
        if (it == col.end()) return dflt;
        if (it->second >= cells.size()) return make_error(where + ": missing '" + name + "'");
        return number(cells[it->second], where + " " + name);
      };
      double v[6];
      const char* names[6] = {"arrival_s", "prompt_tokens", "output_tokens",
                              "priority",  "prefix_group",  "prefix_tokens"};
      const double dflt[6] = {0, 0, 0, 0, -1, 0};
      for (int k = 0; k < 6; ++k) {
        auto x = get(names[k], dflt[k]);
        if (!x) return x.error();
        v[k] = *x;
      }
      for (int k = 1; k < 6; ++k)
        if (std::fabs(v[k]) > 1e8) return make_error(where + ": '" + names[k] + "' is out of range");
      r.arrival_s = v[0];
      r.prompt_tokens = static_cast<int32_t>(v[1]);
      r.output_tokens = static_cast<int32_t>(v[2]);
      r.priority = static_cast<int32_t>(v[3]);
      r.prefix_group = static_cast<int32_t>(v[4]);
      r.prefix_tokens = static_cast<int32_t>(v[5]);
    }
    TROUPE_TRY(check_request(r, where));
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const SimRequest& a, const SimRequest& b) { return a.arrival_s < b.arrival_s; });
  const double t0 = azure && !out.empty() ? out.front().arrival_s : 0;  // Azure: seconds from the first request
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].id = static_cast<int64_t>(i);
    out[i].arrival_s -= t0;
  }
  return out;
}

}  // namespace troupe::sim
