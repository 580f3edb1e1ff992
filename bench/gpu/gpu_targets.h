// What troupe_gpu_bench records (a row per measurement) and the table of the issue's
// targets it ends with (bench/gpu/gpu_bench.cpp, docs/gpu.md).
#pragma once
#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace gpu_bench {

struct Row {
  std::string what, shape;
  double ms = 0, rate = 0;  // rate in GB/s or TFLOP/s
  std::string unit;         // "GB/s" | "TFLOP/s" | "tok/s"
  double pct = -1;          // of the ceiling named in `of`
  std::string of;
};

// The targets (docs/gpu.md) from a run's rows: for each, the best row that
// measures it beside its goal, so a run's table says at once what is met and what is not.
inline nlohmann::json targets_table(const std::vector<Row>& rows, double decode_parts_ms, std::ostream& md,
                                    bool print = true) {
  struct Target {
    std::string name, row;
    double got = -1, goal;
    bool at_most;  // the goal is an upper bound
  };
  auto starts = [](const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; };
  auto best = [&](const std::string& name, double goal, const std::function<bool(const Row&)>& pick) {
    Target t{name, "", -1, goal, false};
    for (const auto& r : rows)
      if (r.pct >= 0 && pick(r) && r.pct > t.got) {
        t.got = r.pct;
        t.row = r.what + " (" + r.shape + ")";
      }
    return t;
  };
  std::vector<Target> ts;
  ts.push_back(best("decode at batch 1, Llama-3-8B bf16: % of the bandwidth roofline", 85,
                    [](const Row& r) { return r.of == "bandwidth roofline"; }));
  ts.push_back(best("decode attention, 16 x 4096 context: % of copy bandwidth", 85,
                    [&](const Row& r) { return starts(r.what, "decode attention"); }));
  // The quantized GEMVs: each type's best kernel at one token, then the worst of those.
  Target q{"quantized GEMV at one token (worst type's best kernel): % of copy bandwidth", "", -1, 85, false};
  for (const char* type : {"q8_0", "q4_0", "q4_1", "q4_k", "q6_k"}) {
    const Target t = best(type, 85, [&](const Row& r) {
      return starts(r.what, std::string("GEMV ") + type + " ") && r.shape.size() >= 3 &&
             r.shape.compare(r.shape.size() - 3, 3, "n=1") == 0;
    });
    if (t.got >= 0 && (q.got < 0 || t.got < q.got)) {
      q.got = t.got;
      q.row = t.row;
    }
  }
  ts.push_back(q);
  ts.push_back(best("prefill matmul: % of cuBLAS at the same shape", 90,
                    [](const Row& r) { return r.of == "cuBLAS same shape"; }));
  ts.push_back(best("prefill attention, 4096 tokens: % of bf16 GEMM peak", 50,
                    [&](const Row& r) { return starts(r.what, "prefill attention"); }));
  // Time between kernels at batch 1: the step beside the sum of its ops timed alone.
  Target gap{"time between kernels at batch 1 (step - its ops timed alone): % of the step", "", -1, 5, true};
  for (const auto& r : rows)
    if (decode_parts_ms >= 0 && r.what == "decode Llama-3-8B dummy bf16, batch-invariant GEMV, CUDA graphs" &&
        r.shape == "batch 1, ctx 1024" && r.ms > 0) {
      gap.got = std::max(0.0, 100.0 * (r.ms - decode_parts_ms) / r.ms);
      gap.row = r.what + " (" + r.shape + ") vs decode parts summed";
    }
  ts.push_back(gap);
  md << "\n## Targets\n\n| target | measured | goal | met | from |\n|---|---:|---:|---|---|\n";
  if (print) std::printf("\ntargets:\n");
  nlohmann::json jt = nlohmann::json::array();
  for (const auto& t : ts) {
    const bool measured = t.got >= 0;
    const bool met = measured && (t.at_most ? t.got <= t.goal : t.got >= t.goal);
    char got[32], goal[32];
    std::snprintf(got, sizeof got, measured ? "%.1f%%" : "not measured", t.got);
    std::snprintf(goal, sizeof goal, "%s %.0f%%", t.at_most ? "<=" : ">=", t.goal);
    md << "| " << t.name << " | " << got << " | " << goal << " | " << (met ? "yes" : "no") << " | " << t.row << " |\n";
    if (print) std::printf("  %-80s %12s  goal %-6s %s\n", t.name.c_str(), got, goal, met ? "met" : "MISSED");
    jt.push_back({{"target", t.name},
                  {"measured_pct", t.got},
                  {"goal_pct", t.goal},
                  {"at_most", t.at_most},
                  {"met", met},
                  {"from", t.row}});
  }
  return jt;
}

}  // namespace gpu_bench
