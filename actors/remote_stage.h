// Pipeline stages in another process (`troupe node`), over an authenticated node link
// (actors/node_link.h).
//
// Head side: a proxy with the stage actor's interface. It encodes each StageStep it gets
// (Cap'n Proto, actors/codec.h) onto the link and remembers the step's sink with a
// deadline; the link's reader thread decodes the node's answers: a step result goes to the
// sink, a middle stage's activations go on to the next (local) stage. A step that finds no
// answer by its deadline, or a link that breaks, fails every step in flight with an error
// naming the node (the scheduler then fails the requests, /health says why); an answer
// that arrives after its step was failed is stale and dropped.
//
// Node side: serve_stage_link() runs one head's connection: the hello names the layers and
// the KV pool; the node builds that stage (worker and stage actors, as a local node would)
// and feeds it the decoded steps until the link ends, then frees it all.
#pragma once
#include <memory>
#include <string>

#include "actors/messages.h"
#include "actors/node_link.h"
#include "kernels/backend.h"
#include "runtime/model/model_files.h"

namespace troupe::actors {

// Architecture, shape and weight bytes of a model: head and node must hold the same one.
std::string model_fingerprint(const ModelFiles& files);

struct RemoteStageOptions {
  std::string host;
  int port = 0;
  std::string key;
  double step_timeout_s = 30;    // a step unanswered this long fails (with every step in flight)
  double hello_timeout_s = 300;  // building the stage on the node (loading its layers)
};

// Parses "HOST:PORT" ("[v6]:PORT" for IPv6 literals).
Result<std::pair<std::string, int>> parse_host_port(const std::string& s);

// Connects, authenticates, sends the hello and waits for the node's stage (or, for a hello
// naming experts, its expert worker) to be ready.
Result<std::shared_ptr<link::Socket>> connect_stage_node(const RemoteStageOptions& o, const NodeHello& hello,
                                                         NodeHelloReply* reply = nullptr);

// The proxy stage actor for a connected link. `name` names the node in errors and logs.
// When the link goes it tells the scheduler given by (link_scheduler_atom, scheduler)
// (stage_down_atom: the engine fails, also when idle), reconnects every second with `opts`
// and `hello`, and once the node is back tells it again (stage_rejoined_atom).
// Answers are checked against the step sent (`vocab`, `hidden`: the model's sizes): a node
// that breaks the protocol is treated as lost.
stage_actor spawn_remote_stage(caf::actor_system& sys, std::shared_ptr<link::Socket> socket, stage_actor next,
                               std::string name, const RemoteStageOptions& opts, const NodeHello& hello, int32_t vocab,
                               int32_t hidden);
using link_scheduler_atom = caf::atom_constant<caf::atom("linksched")>;

struct StageNodeOptions {
  std::string device = "cpu";
  int32_t threads = 0;
  CudaBackendOptions cuda;
  int32_t max_batch_tokens = 512;
};

// Runs one authenticated head's link until it ends (the head went away, a protocol error,
// or `stop` set); returns why it ended. Every actor and the stage's memory are gone after.
Status serve_stage_link(caf::actor_system& sys, link::Socket& socket, const ModelFiles& files,
                        const StageNodeOptions& opt);

}  // namespace troupe::actors
