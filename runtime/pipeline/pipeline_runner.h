// Runs a checked pipeline spec (pipeline_spec.h) node by node in dependency order over a
// generation function, so the same runner drives the engine (`troupe pipeline run`) and
// the tests' scripted generators. Each node's output is a list of texts (one for generate,
// join and tool; n for fork; one per item for map); a template reads it joined by newlines.
// The run's token budget is shared by every node: a generate's max_tokens is cut to what
// is left, and a node that finds nothing left fails the run. Events (JSON objects) report
// each node's start, outputs, tool calls and the error that ended a run.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/pipeline/pipeline_spec.h"

namespace troupe {

struct GenerateCall {
  std::string node;
  std::string prompt;  // rendered
  int32_t max_tokens = 0, n = 1;
  double temperature = 0, top_p = 1;
  int64_t seed = 0;
  std::vector<std::string> stop;
};

struct GenerateResult {
  std::vector<std::string> texts;  // n of them
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

using GenerateFn = std::function<Result<GenerateResult>(const GenerateCall&)>;
using PipelineEventFn = std::function<void(const nlohmann::json&)>;

struct PipelineRun {
  std::map<std::string, std::vector<std::string>> outputs;
  std::string output;  // the spec's output node, joined
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int32_t generate_calls = 0;
};

// Inputs must name every input the spec uses. An error names the failing node (and is also
// sent as an "error" event).
Result<PipelineRun> run_pipeline(const PipelineSpec& spec, const std::map<std::string, std::string>& inputs,
                                 const GenerateFn& generate, const PipelineEventFn& on_event = {},
                                 const PipelineLimits& limits = {});

// join's vote: the most frequent answer after trimming and lower-casing (ties: the first).
std::string majority_vote(const std::vector<std::string>& answers);

}  // namespace troupe
