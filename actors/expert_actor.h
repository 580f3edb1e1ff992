// Expert parallelism as actors. An expert worker actor owns some routed experts' weights
// (runtime/model/expert_shard.h) on its own device; a stage's worker, in each MoE layer,
// sends every expert worker that holds an expert with rows one ExpertDispatch (its rows,
// expert-major) and combines the ExpertResults in a fixed order (Model::run_moe), so the
// output is bit-identical whatever the layout. ExpertRouter is that dispatch: the
// runtime's ExpertDispatcher over expert actors, local ones or proxies of workers on a
// `troupe node` (the same node link as remote stages, Frame::ExpertDispatch/ExpertResult).
//
//   stage worker ──ExpertDispatch──▶ expert worker A ─┐
//        │      ──ExpertDispatch──▶ expert proxy ══ node link ══▶ troupe node (expert worker B)
//        ◀──────────ExpertResult───────────────────────┘   (every wait has a deadline)
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/messages.h"
#include "actors/remote_stage.h"
#include "kernels/backend.h"
#include "runtime/model/expert_placement.h"
#include "runtime/model/expert_shard.h"
#include "runtime/model/moe.h"

namespace troupe::actors {

// What an expert worker binds: a device and the experts placed on it.
struct ExpertWorker {
  std::string name;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ExpertShard> shard;
};

// The expert worker actor. Blocking compute: spawn it detached.
expert_actor::behavior_type expert_fn(expert_actor::pointer self, std::shared_ptr<ExpertWorker> worker);

// Runs one dispatch on a worker (the actor's body; the node side uses it too).
ExpertResult run_expert_dispatch(ExpertWorker& w, const ExpertDispatch& d);

// The stage side: one MoE layer's routed rows split over the expert workers by the
// placement (each expert with rows to one of its replicas: the least loaded so far in this
// dispatch, ties to the lower worker), one request per worker, all in flight at once, each
// with the deadline; the answers are checked (size) and copied back into the rows.
class ExpertRouter final : public ExpertDispatcher {
 public:
  struct Target {
    expert_actor actor;
    std::string name;                      // "expert worker 'e1' (node 10.0.0.2:7440)": what errors say
    std::chrono::milliseconds timeout{0};  // this worker's deadline (0: the router's)
  };
  ExpertRouter(caf::actor_system& sys, std::vector<Target> workers,
               std::vector<std::vector<std::vector<int32_t>>> replicas, std::chrono::milliseconds timeout,
               std::shared_ptr<MoeStats> stats);
  ~ExpertRouter() override;
  Status run(const ExpertWork& w) override;
  // The backend of the stage that calls run(): its helper threads are parked while the
  // workers compute (on one machine they would spin on the cores the workers need).
  void set_caller_backend(Backend* b) { caller_ = b; }

 private:
  caf::actor_system& sys_;
  std::vector<Target> workers_;
  std::vector<std::vector<std::vector<int32_t>>> replicas_;  // [layer][expert] -> workers
  std::chrono::milliseconds timeout_;
  std::shared_ptr<MoeStats> stats_;
  Backend* caller_ = nullptr;
  uint64_t next_id_ = 1;
  // The blocking actor the requests go from, made on the thread that runs the steps.
  std::unique_ptr<caf::scoped_actor> self_;
  std::thread::id owner_;
  // Scratch per worker (reused across layers).
  std::vector<std::vector<int32_t>> experts_, counts_;
  std::vector<int64_t> load_;
  std::vector<int32_t> holders_;  // [layer]: the workers holding any expert of it
};

// Expert workers in other processes: `troupe node` answers an expert hello (NodeHello with
// `experts`) by building those experts and answering dispatches until the link ends.
// connect_stage_node() connects to one (the hello names the experts it must build).
// The proxy: an expert_actor whose dispatches go over the link (detached: blocking socket
// IO, one dispatch at a time). A link that breaks (an error, no answer by the deadline, or
// the node closing it while idle, checked every second) fails the dispatch with an error
// naming the worker, tells the scheduler (stage_down_atom: /health 503) once it knows it,
// and reconnects every second; once back it tells the scheduler again (stage_rejoined_atom).
expert_actor spawn_remote_expert(caf::actor_system& sys, std::shared_ptr<link::Socket> socket, std::string name,
                                 const RemoteStageOptions& opts, const NodeHello& hello, int32_t hidden);
// Node side: runs one authenticated head's expert link (after its hello was read).
Status serve_expert_link(caf::actor_system& sys, link::Socket& socket, const ModelFiles& files,
                         const StageNodeOptions& opt, const NodeHello& hello, const std::string& fingerprint);

}  // namespace troupe::actors
