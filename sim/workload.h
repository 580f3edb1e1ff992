// Workloads for the simulator: synthetic arrivals (Poisson or gamma with a chosen
// coefficient of variation, fixed / uniform / lognormal lengths, shared-prefix groups)
// and trace files (CSV or JSONL with arrival_s, prompt_tokens, output_tokens and optional
// priority and prefix_group). Deterministic for a seed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.h"

namespace troupe::sim {

struct SimRequest {
  int64_t id = 0;
  double arrival_s = 0;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  int32_t priority = 0;
  int32_t prefix_group = -1;  // requests of one group share their first prefix_tokens tokens
  int32_t prefix_tokens = 0;
};

struct LengthDist {
  std::string kind = "fixed";  // fixed (a) | uniform [a, b] | lognormal (mu a, sigma b)
  double a = 128, b = 0;
};

struct SyntheticSpec {
  int64_t num_requests = 100;
  double rate = 1.0;  // requests per second
  double cv = 1.0;    // inter-arrival coefficient of variation: 1 = Poisson, else gamma
  LengthDist prompt{"fixed", 256, 0}, output{"fixed", 64, 0};
  int32_t num_prefix_groups = 0, prefix_tokens = 0;
  int32_t priority_levels = 1;  // priorities drawn uniformly from 0 .. levels - 1
  uint64_t seed = 0;
};

Result<std::vector<SimRequest>> synthetic(const SyntheticSpec& spec);
// "fixed:N", "uniform:A:B" or "lognormal:MU:SIGMA".
Result<LengthDist> parse_length(const std::string& text);
// A CSV (header row naming the columns) or JSONL trace; sorted by arrival, ids assigned.
// A CSV with TIMESTAMP,ContextTokens,GeneratedTokens is read as an Azure LLM inference
// trace (2023 and 2024 formats), arrivals in seconds from its first request.
Result<std::vector<SimRequest>> read_trace(const std::string& path);

}  // namespace troupe::sim
