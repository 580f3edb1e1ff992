#include "runtime/model/expert_placement.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace troupe {
namespace {

constexpr int32_t kMaxWorkers = 256;

// [3, "4-7", 9] or "0-3" -> the ids, each checked against [0, limit).
Result<std::vector<int32_t>> id_list(const nlohmann::json& j, int32_t limit, const std::string& what) {
  std::vector<nlohmann::json> items;
  if (j.is_array())
    items.assign(j.begin(), j.end());
  else
    items.push_back(j);
  std::set<int32_t> ids;
  auto add = [&](int64_t a, int64_t b) -> Status {
    if (a < 0 || b >= limit || a > b)
      return make_error(what + ": " + std::to_string(a) + (a == b ? "" : "-" + std::to_string(b)) + " is outside 0.." +
                        std::to_string(limit - 1));
    for (int64_t i = a; i <= b; ++i) ids.insert(static_cast<int32_t>(i));
    return {};
  };
  for (const auto& it : items) {
    if (it.is_number_integer()) {
      TROUPE_TRY(add(it.get<int64_t>(), it.get<int64_t>()));
    } else if (it.is_string()) {
      const std::string s = it.get<std::string>();
      const auto dash = s.find('-');
      try {
        size_t used = 0;
        if (dash == std::string::npos) {
          const long long v = std::stoll(s, &used);
          if (used != s.size()) throw std::invalid_argument(s);
          TROUPE_TRY(add(v, v));
        } else {
          const long long a = std::stoll(s.substr(0, dash), &used);
          if (used != dash) throw std::invalid_argument(s);
          const std::string rest = s.substr(dash + 1);
          const long long b = std::stoll(rest, &used);
          if (used != rest.size()) throw std::invalid_argument(s);
          TROUPE_TRY(add(a, b));
        }
      } catch (const std::logic_error&) { return make_error(what + ": '" + s + "' is not an id or a range A-B"); }
    } else {
      return make_error(what + ": expected ids (numbers or \"A-B\" ranges)");
    }
  }
  if (ids.empty()) return make_error(what + ": the list is empty");
  return std::vector<int32_t>(ids.begin(), ids.end());
}

Status check_cover(const ExpertPlacement& p, const ModelConfig& cfg) {
  if (p.workers.empty()) return make_error("expert placement: no workers");
  if (p.workers.size() > static_cast<size_t>(kMaxWorkers))
    return make_error("expert placement: more than " + std::to_string(kMaxWorkers) + " workers");
  const auto rep = p.replicas(cfg);
  for (int32_t l = 0; l < cfg.num_layers; ++l)
    for (int32_t e = 0; e < cfg.moe.num_experts; ++e)
      if (rep[l][e].empty())
        return make_error("expert placement: expert " + std::to_string(e) + " of layer " + std::to_string(l) +
                          " is on no worker");
  return {};
}

}  // namespace

Result<ExpertPlacement> ExpertPlacement::even(int32_t n, const ModelConfig& cfg) {
  const int32_t E = cfg.moe.num_experts;
  if (!cfg.moe.enabled()) return make_error("--expert-parallel needs a mixture-of-experts model");
  if (n < 1 || n > E) return make_error("--expert-parallel must be 1.." + std::to_string(E) + " for this model");
  ExpertPlacement p;
  for (int32_t w = 0; w < n; ++w) {
    Worker wk;
    wk.name = "expert-" + std::to_string(w);
    std::vector<int32_t> ids;
    for (int32_t e = E * w / n; e < E * (w + 1) / n; ++e) ids.push_back(e);
    for (int32_t l = 0; l < cfg.num_layers; ++l) wk.experts[l] = ids;
    p.workers.push_back(std::move(wk));
  }
  return p;
}

Result<ExpertPlacement> ExpertPlacement::parse(const std::string& text, const ModelConfig& cfg) {
  if (!cfg.moe.enabled()) return make_error("an expert placement needs a mixture-of-experts model");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return make_error(std::string("expert placement: not JSON: ") + e.what());
  }
  if (!j.is_object()) return make_error("expert placement: expected an object {\"workers\": [...]}");
  for (const auto& [k, v] : j.items())
    if (k != "workers") return make_error("expert placement: unknown key '" + k + "'");
  if (!j.contains("workers") || !j["workers"].is_array())
    return make_error("expert placement: \"workers\" must be a list");
  ExpertPlacement p;
  std::set<std::string> names;
  size_t idx = 0;
  for (const auto& w : j["workers"]) {
    const std::string at = "expert placement: worker " + std::to_string(idx++);
    if (!w.is_object()) return make_error(at + ": expected an object");
    Worker wk;
    for (const auto& [k, v] : w.items())
      if (k != "name" && k != "node" && k != "experts" && k != "layers")
        return make_error(at + ": unknown key '" + k + "'");
    if (w.contains("name")) {
      if (!w["name"].is_string() || w["name"].get<std::string>().empty() || w["name"].get<std::string>().size() > 64)
        return make_error(at + ": \"name\" must be a string of 1..64 characters");
      wk.name = w["name"].get<std::string>();
    } else {
      wk.name = "expert-" + std::to_string(idx - 1);
    }
    const std::string who = "expert placement: worker '" + wk.name + "'";
    if (!names.insert(wk.name).second) return make_error(who + ": the name is used twice");
    if (w.contains("node")) {
      if (!w["node"].is_string() || w["node"].get<std::string>().find(':') == std::string::npos)
        return make_error(who + ": \"node\" must be \"HOST:PORT\"");
      wk.node = w["node"].get<std::string>();
    }
    if (!w.contains("experts")) return make_error(who + ": \"experts\" is missing");
    auto ids = id_list(w["experts"], cfg.moe.num_experts, who + ": \"experts\"");
    if (!ids) return ids.error();
    std::vector<int32_t> layers;
    if (w.contains("layers")) {
      auto ls = id_list(w["layers"], cfg.num_layers, who + ": \"layers\"");
      if (!ls) return ls.error();
      layers = std::move(*ls);
    } else {
      for (int32_t l = 0; l < cfg.num_layers; ++l) layers.push_back(l);
    }
    for (int32_t l : layers) wk.experts[l] = *ids;
    p.workers.push_back(std::move(wk));
  }
  TROUPE_TRY(check_cover(p, cfg));
  return p;
}

Result<ExpertPlacement> ExpertPlacement::load(const std::string& path, const ModelConfig& cfg) {
  std::ifstream f(path);
  if (!f) return make_error("cannot read the expert placement file '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  if (ss.str().size() > (1u << 20)) return make_error("expert placement file '" + path + "' is over 1 MiB");
  auto p = parse(ss.str(), cfg);
  if (!p) return make_error(path + ": " + p.error().message);
  return p;
}

std::vector<std::vector<std::vector<int32_t>>> ExpertPlacement::replicas(const ModelConfig& cfg) const {
  std::vector<std::vector<std::vector<int32_t>>> r(
      static_cast<size_t>(cfg.num_layers), std::vector<std::vector<int32_t>>(static_cast<size_t>(cfg.moe.num_experts)));
  for (size_t w = 0; w < workers.size(); ++w)
    for (const auto& [l, ids] : workers[w].experts)
      if (l >= 0 && l < cfg.num_layers)
        for (int32_t e : ids)
          if (e >= 0 && e < cfg.moe.num_experts) r[l][e].push_back(static_cast<int32_t>(w));
  return r;
}

std::vector<std::string> ExpertPlacement::describe() const {
  std::vector<std::string> out;
  for (const auto& w : workers) {
    size_t n = 0;
    for (const auto& [l, ids] : w.experts) n += ids.size();
    out.push_back(w.name + (w.node.empty() ? " (this process)" : " (node " + w.node + ")") + ": " + std::to_string(n) +
                  " layer-experts over " + std::to_string(w.experts.size()) + " layers");
  }
  return out;
}

}  // namespace troupe
