// Workloads for the simulator: synthetic arrivals (Poisson or gamma with a chosen
// coefficient of variation, fixed / uniform / lognormal lengths, shared-prefix groups)
// and trace files (CSV or JSONL with arrival_s, prompt_tokens, output_tokens and optional
// priority and prefix_group). Deterministic for a seed.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

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
  std::string kind = "fixed";  // fixed (a) | uniform [a, b] | lognormal (mu a, sigma b) | empirical
  double a = 128, b = 0;
  std::vector<int32_t> samples;  // empirical: drawn uniformly from these
};

struct SyntheticSpec {
  int64_t num_requests = 100;
  double rate = 1.0;  // requests per second
  double cv = 1.0;    // inter-arrival coefficient of variation: 1 = Poisson, else gamma
  LengthDist prompt{"fixed", 256, 0, {}}, output{"fixed", 64, 0, {}};
  int32_t num_prefix_groups = 0, prefix_tokens = 0;
  int32_t priority_levels = 1;  // priorities drawn uniformly from 0 .. levels - 1
  uint64_t seed = 0;
};

Result<std::vector<SimRequest>> synthetic(const SyntheticSpec& spec);
// "fixed:N", "uniform:A:B", "lognormal:MU:SIGMA", or "trace:FILE" (the prompt or output
// lengths of a trace or ShareGPT file, drawn uniformly; `output` picks which).
Result<LengthDist> parse_length(const std::string& text, bool output = false);

// Counts a text's tokens (a real tokenizer, or an estimate).
using TokenCounter = std::function<int32_t(std::string_view)>;
// The estimate used without a tokenizer: one token per 4 bytes, at least 1.
int32_t estimate_tokens(std::string_view text);
// A ShareGPT-style JSON file ([{"conversations": [{"from": "human", "value": ...},
// {"from": "gpt", "value": ...}, ...]}, ...]): each conversation's first human turn is a
// prompt and the reply after it sets the output length (vLLM's benchmark does the same).
// Conversations without such a pair are skipped. ShareGPT has no times: arrivals come from
// `arrivals` (Poisson/gamma with its rate, cv and seed; lengths and counts ignored), and
// at most arrivals.num_requests conversations are used (0: all).
Result<std::vector<SimRequest>> read_sharegpt(const std::string& path, const TokenCounter& count,
                                              const SyntheticSpec& arrivals);
// A CSV (header row naming the columns) or JSONL trace; sorted by arrival, ids assigned.
// A .json file is read as ShareGPT with estimated token counts and 1 request/s Poisson
// arrivals (read_sharegpt for more control).
// A CSV with TIMESTAMP,ContextTokens,GeneratedTokens is read as an Azure LLM inference
// trace (2023 and 2024 formats), arrivals in seconds from its first request.
Result<std::vector<SimRequest>> read_trace(const std::string& path);

}  // namespace troupe::sim
