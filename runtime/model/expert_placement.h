// Where each routed expert runs under expert parallelism: a set of named expert workers,
// each holding some experts of some MoE layers, in this process or on a `troupe node`.
// An expert may live on several workers (replicas of hot experts, as DeepSeek-V3's
// deployment does); every (layer, expert) must live somewhere. docs/moe.md shows the file.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "runtime/model/model_config.h"

namespace troupe {

struct ExpertPlacement {
  struct Worker {
    std::string name;
    std::string node;                                 // "HOST:PORT" of a `troupe node`; empty: an actor in this process
    std::map<int32_t, std::vector<int32_t>> experts;  // layer -> expert ids, ascending
  };
  std::vector<Worker> workers;

  // `--expert-parallel N`: experts split into N contiguous, even ranges, every layer alike.
  static Result<ExpertPlacement> even(int32_t n, const ModelConfig& cfg);
  // A placement file (JSON, docs/moe.md). Errors name the worker and the key.
  static Result<ExpertPlacement> parse(const std::string& json_text, const ModelConfig& cfg);
  static Result<ExpertPlacement> load(const std::string& path, const ModelConfig& cfg);

  // replicas[layer][expert]: the workers holding that expert, ascending.
  std::vector<std::vector<std::vector<int32_t>>> replicas(const ModelConfig& cfg) const;
  // One line per worker, for the log.
  std::vector<std::string> describe() const;
};

}  // namespace troupe
