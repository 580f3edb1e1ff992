// The actors of one node, spawned and connected: N pipeline stages (each with its layer
// range and its own worker actor binding a device), the scheduler actor, the
// KV-block-manager actor and a tokenizer pool. `troupe serve` and the
// actor tests build their nodes with this one function, from explicit options.
#pragma once
#include <string>
#include <memory>
#include <vector>

#include <map>

#include <optional>

#include "actors/expert_actor.h"
#include "actors/kv_block_actor.h"
#include "actors/remote_stage.h"
#include "actors/request_actor.h"
#include "actors/scheduler_actor.h"
#include "actors/stage_actor.h"
#include "actors/tokenizer_actor.h"
#include "actors/worker_actor.h"
#include "runtime/model/model_files.h"

namespace troupe::actors {

struct NodeOptions {
  int32_t num_stages = 1;      // layers split evenly over the stages
  int32_t threads = 0;         // CPU threads per worker (0: all cores)
  std::string device = "cpu";  // cpu | cuda | cuda:N (every stage on that device)
  CudaBackendOptions cuda;     // CUDA: batch invariance, graphs, tensor-core matmul (device from `device`)
  int32_t max_batch_tokens = 512;
  int32_t num_tokenizers = 1;
  // false: a model without a tokenizer (dummy weights) is served token ids only: no
  // tokenizer pool, no end-of-generation token (`troupe bench`).
  bool require_tokenizer = true;
  bool detached_workers = true;      // workers on their own threads (false: deterministic tests)
  bool check_kv_invariants = false;  // the KV-block-manager actor checks its invariants after every request
  uint64_t fail_step = 0;            // fault injection: the last stage's worker fails this step (0: never)
  uint64_t hang_step = 0;            // fault injection: the last stage's worker hangs in this step until released
  SchedulerActorConfig scheduler;    // vocab, context and end-of-generation filled in from the model
  // Stages run by `troupe node` processes (stage index -> node): connected, authenticated
  // and built at spawn time; stage 0 (the embedding) stays here.
  std::map<int32_t, RemoteStageOptions> remote_stages;
  // Expert parallelism (MoE models): the routed experts run on these expert workers
  // (actors here, or `troupe node`s) instead of inside each stage; unset: inside.
  std::optional<ExpertPlacement> experts;
  int32_t expert_threads = 0;    // CPU threads per expert worker here (0: the cores over the workers, >= 1)
  double expert_timeout_s = 30;  // one dispatch's deadline
  std::string expert_key;        // node-link key for expert workers on other nodes
};

struct LocalNode {
  scheduler_actor scheduler;
  kv_block_actor kv;
  std::vector<stage_actor> stages;
  std::vector<worker_actor> workers;  // one per local stage, in stage order
  std::vector<std::string> backends;  // the local workers' backend names ("cpu(AVX512, 2 threads)")
  std::vector<expert_actor> experts;  // expert workers (expert parallelism), placement order
  std::shared_ptr<MoeStats> moe;      // MoE models: routing counts and dispatch costs
  std::shared_ptr<TokenizerPool> tokenizers;
  std::shared_ptr<StatsBoard> board;
  RequestContext request_context;
  // Sends every actor an exit message (request actors end on their own).
  void stop();
};

Result<LocalNode> spawn_local_node(caf::actor_system& sys, const ModelFiles& files, NodeOptions opt,
                                   const ProgressFn& progress = {});

}  // namespace troupe::actors
