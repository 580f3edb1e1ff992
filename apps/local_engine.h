// The engine `troupe run` and `troupe bench` drive: the node of actors `troupe serve`
// builds (scheduler, KV-block manager, stage and worker actors), in this process, with one
// caller submitting sequences instead of HTTP. One run loop for every subcommand, so what
// the scheduler does (batching, prefix caching, determinism) is what all of them measure.
#pragma once
#include <caf/all.hpp>

#include <functional>
#include <memory>

#include "actors/local_node.h"
#include "apps/common.h"

namespace troupe::app {

// Expert parallelism flags (run, bench, serve): where a MoE model's routed experts run.
struct ExpertFlags {
  int parallel = 0;       // --expert-parallel N: N expert workers here, experts split evenly
  std::string placement;  // --expert-placement FILE (JSON, docs/moe.md)
  int threads = 0;        // --expert-threads
  double timeout = 30;    // --expert-timeout (seconds per dispatch)
  std::string key_file;   // the node key, for workers on `troupe node`s (serve: --node-key-file)
  // with_key: also --node-key-file (serve has its own, shared with --remote-stage).
  void add_to(CLI::App& app, bool with_key);
  bool enabled() const { return parallel > 0 || !placement.empty(); }
  // The placement the flags name for this model (even ranges or the file), the flags checked.
  Result<ExpertPlacement> placement_for(const ModelConfig& cfg) const;
  // Fills the node options' expert fields for this model (an error names the flag).
  Status apply(const ModelConfig& cfg, actors::NodeOptions& no) const;
};

struct LocalEngineOptions {
  int32_t kv_tokens = 4096;  // KV-cache capacity over all sequences
  int32_t block_size = 16;
  bool prefix_caching = true;  // a chat's next turn reuses the earlier turns' blocks
  int32_t max_running = 8;
  bool require_tokenizer = true;  // false: dummy weights (bench), token ids only
  ExpertFlags experts;
};

// The node options every subcommand takes from the model flags (threads, device, batch).
actors::NodeOptions node_options(const ModelFlags& flags);

class LocalEngine {
 public:
  // Opens the model the flags name (progress bar on stderr) and spawns the node.
  static Result<std::unique_ptr<LocalEngine>> start(const ModelFlags& flags, const LocalEngineOptions& opt);
  ~LocalEngine();
  LocalEngine(const LocalEngine&) = delete;
  LocalEngine& operator=(const LocalEngine&) = delete;

  const ModelFiles& files() const { return *files_; }
  const std::string& device() const { return device_; }
  // Submits one sequence and blocks until it finishes, calling on_event (on this thread)
  // for every sampled token; on_event returning false cancels the sequence (its blocks are
  // freed) and ends the call. The error of a refused or failed sequence is returned.
  Status run_seq(SeqRequest r, const std::function<bool(const actors::SeqEvent&)>& on_event);
  int64_t next_id() { return next_id_++; }

 private:
  LocalEngine() = default;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::shared_ptr<ModelFiles> files_;
  actors::LocalNode node_;
  std::string device_;
  int64_t next_id_ = 1;
  bool started_ = false;
};

}  // namespace troupe::app
