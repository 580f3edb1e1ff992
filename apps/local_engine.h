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

struct LocalEngineOptions {
  int32_t kv_tokens = 4096;  // KV-cache capacity over all sequences
  int32_t block_size = 16;
  bool prefix_caching = true;  // a chat's next turn reuses the earlier turns' blocks
  int32_t max_running = 8;
  bool require_tokenizer = true;  // false: dummy weights (bench), token ids only
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
