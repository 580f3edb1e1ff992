// Agent pipelines (issue 36): the declarative JSON spec of a graph of generation and tool
// steps, parsed and checked once (docs/pipelines.md). A node reads earlier nodes' outputs
// through prompt templates ("{{id}}", "{{input.key}}", "{{item}}" inside a map), or names
// them ("from", "over"); the graph must be acyclic, every reference must exist, and the
// fan-out and token budgets must fit the server's limits. Every error names the node.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace troupe {

struct PipelineLimits {
  int32_t max_nodes = 64;
  int32_t max_fanout = 16;             // fork n, map items
  int32_t max_tokens_per_node = 4096;  // a generate's max_tokens
  int64_t max_budget_tokens = 65536;   // the whole run's token budget
  size_t max_template_bytes = 16384;
};

enum class PipelineNodeKind { Generate, Fork, Join, Map, Tool };

struct PipelineNode {
  std::string id;
  PipelineNodeKind kind = PipelineNodeKind::Generate;
  // generate, fork, map: the prompt template and sampling settings
  std::string prompt;
  int32_t max_tokens = 64;
  double temperature = 0;
  double top_p = 1;
  int64_t seed = 0;
  std::vector<std::string> stop;
  int32_t n = 1;        // fork: branches continuing the same prompt
  std::string from;     // join: the node whose list it joins
  std::string mode;     // join: concat | vote | first
  std::string over;     // map: the node whose output's lines (or JSON list) it fans out over
  std::string tool;     // tool: calculator | json_extract | regex_extract
  std::string input;    // tool: its input template
  std::string pattern;  // tool regex_extract / json_extract: the regex or the JSON key
  // The nodes it reads (from its templates and fields), in order of first use.
  std::vector<std::string> deps;
};

struct PipelineSpec {
  std::string name;
  std::vector<PipelineNode> nodes;  // in an order where every node follows what it reads
  std::vector<std::string> inputs;  // the run inputs its templates use ("{{input.key}}")
  int64_t budget_tokens = 0;        // generated tokens over the whole run
  std::string output;               // the node whose output is the run's (default: the last)
};

// Parses and checks a spec. A node's template references, in "{{...}}": an earlier node's
// id, "input.KEY" or (in a map's prompt) "item".
Result<PipelineSpec> parse_pipeline(const nlohmann::json& j, const PipelineLimits& limits = {});

// The names a template references, in order ("{{ a }}" -> "a"); an error for an unclosed
// "{{" or an empty or malformed name.
Result<std::vector<std::string>> template_refs(const std::string& tmpl);
// The template with each reference replaced by lookup(name); an error names a reference
// lookup does not know (returns null).
Result<std::string> render_template(const std::string& tmpl,
                                    const std::function<const std::string*(const std::string&)>& lookup);

}  // namespace troupe
