#include "actors/remote_stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <optional>
#include <filesystem>
#include <thread>

#include "actors/codec.h"
#include "actors/expert_actor.h"
#include "actors/stage_actor.h"
#include "actors/worker_actor.h"
#include "runtime/model/model.h"

namespace troupe::actors {
namespace {

using link_down_atom = caf::atom_constant<caf::atom("linkdown")>;
using link_tick_atom = caf::atom_constant<caf::atom("linktick")>;
using link_retry_atom = caf::atom_constant<caf::atom("linkretry")>;
using activations_atom = caf::atom_constant<caf::atom("activs")>;

// The proxy's full interface: the stage's, plus what its reader thread and timers send it
// (a link's messages carry its generation: those of a replaced link are dropped) and the
// scheduler it tells when the node is back.
using remote_stage_actor =
    stage_actor::extend<caf::reacts_to<StepDone>, caf::reacts_to<StepFailed>,
                        caf::reacts_to<activations_atom, StageStep>,
                        caf::reacts_to<link_down_atom, uint64_t, std::string>, caf::reacts_to<link_tick_atom>,
                        caf::reacts_to<link_retry_atom>, caf::reacts_to<link_scheduler_atom, scheduler_actor>>;

constexpr auto kTick = std::chrono::milliseconds(250);

// The reader thread: decodes the node's frames and hands them to the proxy. It holds the
// proxy weakly (the proxy owns the thread through its state).
struct LinkReader {
  std::shared_ptr<link::Socket> socket;
  std::thread thread;
  ~LinkReader() {
    if (socket) socket->shutdown();
    if (thread.joinable()) thread.join();
  }
};

void read_loop(std::shared_ptr<link::Socket> socket, caf::actor_addr proxy_addr, uint64_t gen) {
  auto tell = [&](auto&&... xs) {
    if (auto proxy = caf::actor_cast<caf::actor>(proxy_addr)) caf::anon_send(proxy, std::forward<decltype(xs)>(xs)...);
  };
  for (;;) {
    auto frame = link::read_frame(*socket, -1);
    if (!frame) return tell(link_down_atom::value, gen, "connection lost: " + frame.error().message);
    auto& [type, bytes] = *frame;
    if (type == link::Frame::StepResult) {
      auto r = codec::decode_step_result(bytes);
      if (!r) return tell(link_down_atom::value, gen, "bad step result from the node: " + r.error().message);
      if (auto* d = std::get_if<StepDone>(&*r))
        tell(std::move(*d));
      else
        tell(std::get<StepFailed>(std::move(*r)));
    } else if (type == link::Frame::Activations) {
      auto s = codec::decode_stage_step(bytes);
      if (!s) return tell(link_down_atom::value, gen, "bad activations from the node: " + s.error().message);
      tell(activations_atom::value, std::move(*s));
    } else {
      return tell(link_down_atom::value, gen, "unexpected frame type " + std::to_string(static_cast<uint32_t>(type)));
    }
  }
}

struct InFlight {
  uint64_t step_no = 0;
  step_sink_actor sink;
  std::chrono::steady_clock::time_point deadline;
  StageStep sent;  // the plan as sent, without its activations: what the answer is checked against
};

// Only validated values cross the link back: a step result must sample exactly the rows
// the step asked for, in order, with tokens inside the vocabulary; a middle stage's answer
// contributes nothing but activations of the right size (the plan it travels with is the
// one sent), so a faulty node cannot make the head write into other sequences' blocks or
// hand a request actor a token it cannot decode.
Status check_result(const StageStep& sent, const StepDone& d, int32_t vocab) {
  if (d.sampled.size() != sent.logit_seq.size())
    return make_error(std::to_string(d.sampled.size()) + " sampled rows for " + std::to_string(sent.logit_seq.size()));
  auto bad_token = [vocab](int32_t t) { return t < 0 || t >= vocab; };
  for (size_t i = 0; i < d.sampled.size(); ++i) {
    const SampledToken& st = d.sampled[i];
    if (st.seq_id != sent.logit_seq[i]) return make_error("row " + std::to_string(i) + " names another sequence");
    if (bad_token(st.result.token) || std::isnan(st.result.logprob))
      return make_error("row " + std::to_string(i) + ": token " + std::to_string(st.result.token) +
                        " outside the vocabulary");
    for (const TokenLogprob& t : st.result.top)
      if (bad_token(t.token) || std::isnan(t.logprob))
        return make_error("row " + std::to_string(i) + ": a bad top token");
  }
  return {};
}

double sane_seconds(double s) { return std::isfinite(s) && s >= 0 && s < 1e6 ? s : 0.0; }

struct RemoteState {
  RemoteState() = default;  // not an aggregate: CAF would try to build it from the actor pointer
  std::unique_ptr<LinkReader> reader;
  stage_actor next;
  int32_t vocab = 0, hidden = 0;  // the model's: what answers are checked against
  std::string node_name;
  std::chrono::milliseconds timeout{30000};
  std::deque<InFlight> in_flight;  // in the order sent (the node answers in that order)
  std::string down;                // non-empty: the link is gone, and why
  RemoteStageOptions opts;         // for reconnecting
  NodeHello hello;
  scheduler_actor scheduler;  // told when a lost node is back
  uint64_t gen = 0;           // the link's generation
  int retries = 0;            // failed reconnections since the link went down
  static inline const char* name = "remote-stage";
};

}  // namespace

std::string model_fingerprint(const ModelFiles& files) {
  const ModelConfig& c = files.config;
  uintmax_t bytes = 0;
  std::error_code ec;
  if (std::filesystem::is_regular_file(files.path, ec)) {
    bytes = std::filesystem::file_size(files.path, ec);
  } else if (std::filesystem::is_directory(files.path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(files.path, ec))
      if (e.is_regular_file(ec) && e.path().extension() == ".safetensors") bytes += e.file_size(ec);
  }
  return files.format + " " + c.arch + " layers " + std::to_string(c.num_layers) + " hidden " +
         std::to_string(c.hidden) + " heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) +
         " ffn " + std::to_string(c.ffn) + " vocab " + std::to_string(c.vocab) + " bytes " + std::to_string(bytes);
}

Result<std::pair<std::string, int>> parse_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    return make_error("'" + s + "' is not HOST:PORT");
  std::string host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string p = s.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    return make_error("bad port in '" + s + "'");
  const int port = std::stoi(p);
  if (port < 1 || port > 65535) return make_error("bad port in '" + s + "'");
  return std::make_pair(host, port);
}

Result<std::shared_ptr<link::Socket>> connect_stage_node(const RemoteStageOptions& o, const NodeHello& hello,
                                                         NodeHelloReply* reply_out) {
  // (a hello naming experts asks the node for an expert worker instead of a stage)
  const bool experts = !hello.experts.empty();
  const std::string where =
      std::string(experts ? "expert node " : "stage node ") + o.host + ":" + std::to_string(o.port);
  const std::string what = experts ? "the experts" : "the stage";
  auto sock = link::connect_tcp(o.host, o.port, 5000);
  if (!sock) return sock.error();
  auto s = std::make_shared<link::Socket>(std::move(*sock));
  if (auto ok = link::authenticate_as_head(*s, o.key); !ok) return make_error(where + ": " + ok.error().message);
  if (auto ok = link::write_frame(*s, link::Frame::Hello, codec::encode(hello)); !ok)
    return make_error(where + ": " + ok.error().message);
  auto frame = link::read_frame(*s, static_cast<int>(o.hello_timeout_s * 1000));
  if (!frame) return make_error(where + ": no answer to the hello: " + frame.error().message);
  if (frame->first != link::Frame::HelloReply) return make_error(where + ": unexpected answer to the hello");
  auto reply = codec::decode_node_hello_reply(frame->second);
  if (!reply) return make_error(where + ": " + reply.error().message);
  if (!reply->error.empty()) return make_error(where + " refused " + what + ": " + reply->error);
  if (reply->model != hello.model)
    return make_error(where + " holds another model (" + reply->model + "; here: " + hello.model + ")");
  if (reply_out) *reply_out = std::move(*reply);
  return s;
}

stage_actor spawn_remote_stage(caf::actor_system& sys, std::shared_ptr<link::Socket> socket, stage_actor next,
                               std::string name, const RemoteStageOptions& opts, const NodeHello& hello, int32_t vocab,
                               int32_t hidden) {
  using self_ptr = remote_stage_actor::stateful_pointer<RemoteState>;
  auto fn = [](self_ptr self, std::shared_ptr<link::Socket> sock, stage_actor nxt, std::string nm, RemoteStageOptions o,
               NodeHello h, int32_t vocab_size, int32_t hidden_size) -> remote_stage_actor::behavior_type {
    auto& st = self->state;
    st.vocab = vocab_size;
    st.hidden = hidden_size;
    st.next = std::move(nxt);
    st.node_name = std::move(nm);
    st.opts = std::move(o);
    st.hello = std::move(h);
    st.timeout = std::chrono::milliseconds(static_cast<int64_t>(st.opts.step_timeout_s * 1000));
    // A (new) link: its reader thread, and the deadline check.
    auto attach = [self](std::shared_ptr<link::Socket> s) {
      auto& st = self->state;
      // A send blocked on a frozen node must not outlast the step's deadline (this actor
      // checks deadlines between messages).
      s->set_send_timeout(static_cast<int>(std::max<int64_t>(500, st.timeout.count())));
      st.reader.reset();  // the old reader (if any) is shut down and joined
      st.reader = std::make_unique<LinkReader>();
      st.reader->socket = s;
      st.reader->thread = std::thread(read_loop, s, self->address(), ++st.gen);
      self->delayed_send(self, kTick, link_tick_atom::value);
    };
    attach(std::move(sock));
    // Fails every step in flight and every later one: the link is gone.
    auto go_down = [self](const std::string& why) {
      auto& st = self->state;
      if (!st.down.empty()) return;
      st.down = st.node_name + ": " + why;
      spdlog::error("{}", st.down);
      st.reader->socket->shutdown();
      for (auto& f : st.in_flight) self->send(f.sink, StepFailed{f.step_no, st.down});
      st.in_flight.clear();
      if (st.scheduler) self->send(st.scheduler, stage_down_atom::value, st.down);  // also when idle
      st.retries = 0;
      self->delayed_send(self, std::chrono::seconds(1), link_retry_atom::value);
    };
    // The step an answer is for, or none when the step already failed (stale).
    auto take = [self](uint64_t step_no) -> std::optional<InFlight> {
      auto& q = self->state.in_flight;
      for (auto it = q.begin(); it != q.end(); ++it)
        if (it->step_no == step_no) {
          InFlight f = std::move(*it);
          q.erase(it);
          return f;
        }
      return std::nullopt;
    };
    // A protocol violation in the answer to `f` (already taken from the steps in flight).
    auto fail_down = [self, go_down](const InFlight& f, const std::string& why) {
      go_down(why);
      self->send(f.sink, StepFailed{f.step_no, self->state.down});
    };
    return {
        [=](StageStep& s, step_sink_actor sink) {
          auto& st = self->state;
          if (!st.down.empty()) return self->send(sink, StepFailed{s.step_no, st.down});
          const uint64_t step_no = s.step_no;
          const codec::Bytes bytes = codec::encode(s);
          s.hidden = {};  // (kept without the activations it carried)
          st.in_flight.push_back({step_no, sink, std::chrono::steady_clock::now() + st.timeout, std::move(s)});
          if (auto ok = link::write_frame(*st.reader->socket, link::Frame::Step, bytes); !ok)
            go_down("sending step " + std::to_string(step_no) + ": " + ok.error().message);
        },
        [=](StepDone& d) {
          auto f = take(d.step_no);
          if (!f) return;
          if (self->state.next) return fail_down(*f, "a step result from a middle stage");
          if (auto ok = check_result(f->sent, d, self->state.vocab); !ok)
            return fail_down(*f, "invalid step result from the node: " + ok.error().message);
          d.compute_seconds = sane_seconds(d.compute_seconds);
          self->send(f->sink, std::move(d));
        },
        [=](StepFailed& fail) {
          if (auto f = take(fail.step_no))
            self->send(f->sink, StepFailed{fail.step_no, self->state.node_name + ": " + fail.error});
        },
        [=](activations_atom, StageStep& s) {
          auto f = take(s.step_no);
          if (!f) return;
          auto& st = self->state;
          if (!st.next) return fail_down(*f, "activations from the last stage");
          if (s.hidden.size() != f->sent.token_ids.size() * static_cast<size_t>(st.hidden))
            return fail_down(*f, "invalid activations from the node: " + std::to_string(s.hidden.size()) +
                                     " values for " + std::to_string(f->sent.token_ids.size()) + " tokens");
          StageStep out = std::move(f->sent);  // the plan as sent; the node adds its activations only
          out.hidden = std::move(s.hidden);
          out.compute_seconds = sane_seconds(s.compute_seconds);
          self->send(st.next, std::move(out), f->sink);
        },
        [=](link_down_atom, uint64_t gen, const std::string& why) {
          if (gen == self->state.gen) go_down(why);
        },
        [=](link_scheduler_atom, scheduler_actor sched) { self->state.scheduler = std::move(sched); },
        [=](link_retry_atom) {
          // Reconnect (the node restarted, or the network is back): the node builds the stage
          // anew, with an empty KV cache, so the scheduler drops the cached prefixes too.
          auto& st = self->state;
          if (st.down.empty()) return;
          auto sock = connect_stage_node(st.opts, st.hello);
          if (!sock) {
            if (st.retries++ % 30 == 0) spdlog::warn("{}: reconnecting: {}", st.node_name, sock.error().message);
            self->delayed_send(self, std::chrono::seconds(1), link_retry_atom::value);
            return;
          }
          spdlog::info("{}: the node is back (after {} failed attempt(s))", st.node_name, st.retries);
          const std::string cause = std::exchange(st.down, std::string());
          attach(std::move(*sock));
          if (st.scheduler) self->send(st.scheduler, stage_rejoined_atom::value, cause);
        },
        [=](link_tick_atom) {
          auto& st = self->state;
          if (!st.in_flight.empty() && std::chrono::steady_clock::now() > st.in_flight.front().deadline)
            go_down("no answer to step " + std::to_string(st.in_flight.front().step_no) + " within " +
                    std::to_string(st.timeout.count() / 1000.0).substr(0, 5) + " s");
          if (st.down.empty()) self->delayed_send(self, kTick, link_tick_atom::value);
        },
    };
  };
  // Detached: sending a step is a blocking socket write.
  auto a =
      sys.spawn<caf::detached>(fn, std::move(socket), std::move(next), std::move(name), opts, hello, vocab, hidden);
  return caf::actor_cast<stage_actor>(a);
}

namespace {

// Node side: what the local stage actor sends "onward" goes back over the link: a middle
// stage's activations (as the next stage) and the last stage's results (as the sink).
using link_writer_actor =
    caf::typed_actor<caf::reacts_to<StageStep, step_sink_actor>, caf::reacts_to<StepDone>, caf::reacts_to<StepFailed>>;

link_writer_actor::behavior_type link_writer_fn(link_writer_actor::pointer self, std::shared_ptr<link::Socket> s) {
  auto put = [s](link::Frame type, const codec::Bytes& b) {
    if (auto ok = link::write_frame(*s, type, b); !ok) {
      spdlog::warn("stage link: {}", ok.error().message);
      s->shutdown();  // the reader then ends the link
    }
  };
  return {
      [=](StageStep& step, step_sink_actor) { put(link::Frame::Activations, codec::encode(step)); },
      [=](StepDone& d) { put(link::Frame::StepResult, codec::encode(d)); },
      [=](StepFailed& f) { put(link::Frame::StepResult, codec::encode(f)); },
  };
}

Status check_hello(const NodeHello& h, const ModelFiles& files, const StageNodeOptions& opt, const std::string& mine) {
  const int32_t L = files.config.num_layers;
  if (h.version != 1) return make_error("link version " + std::to_string(h.version) + " (this node speaks 1)");
  if (h.model != mine) return make_error("another model (head: " + h.model + "; node: " + mine + ")");
  if (h.layer_first < 0 || h.layer_last > L || h.layer_first >= h.layer_last)
    return make_error("layers " + std::to_string(h.layer_first) + ".." + std::to_string(h.layer_last) + " of " +
                      std::to_string(L));
  if (h.is_last != (h.layer_last == L)) return make_error("the last stage must end at the last layer");
  if (h.layer_first == 0) return make_error("the first stage (embedding) runs on the head");
  if (h.kv_blocks < 1 || h.kv_blocks > (1 << 24) || h.block_size < 1 || h.block_size > 256)
    return make_error("KV pool of " + std::to_string(h.kv_blocks) + " blocks of " + std::to_string(h.block_size));
  if (h.max_batch_tokens < 1 || h.max_batch_tokens > opt.max_batch_tokens)
    return make_error("batch of " + std::to_string(h.max_batch_tokens) + " tokens (this node's --batch is " +
                      std::to_string(opt.max_batch_tokens) + ")");
  return {};
}

}  // namespace

Status serve_stage_link(caf::actor_system& sys, link::Socket& socket, const ModelFiles& files,
                        const StageNodeOptions& opt) {
  auto frame = link::read_frame(socket, 30000);
  if (!frame) return make_error("no hello: " + frame.error().message);
  if (frame->first != link::Frame::Hello) return make_error("the first frame is not a hello");
  auto hello = codec::decode_node_hello(frame->second);
  if (!hello) return hello.error();
  const std::string mine = model_fingerprint(files);
  if (!hello->experts.empty()) return serve_expert_link(sys, socket, files, opt, *hello, mine);
  auto refuse = [&](const std::string& why) -> Status {
    NodeHelloReply r{why, mine, ""};
    (void)link::write_frame(socket, link::Frame::HelloReply, codec::encode(r));
    return make_error("refused the head's stage: " + why);
  };
  if (auto ok = check_hello(*hello, files, opt, mine); !ok) return refuse(ok.error().message);
  auto backend = make_backend(opt.device, opt.threads, opt.cuda);
  if (!backend) return refuse(backend.error().message);
  const std::string device = (*backend)->name();
  auto model = Model::build(files.config, *files.weights, **backend, hello->max_batch_tokens, {},
                            LayerRange{hello->layer_first, hello->layer_last});
  if (!model) return refuse(model.error().message);
  KvBlockConfig kv;
  kv.num_blocks = hello->kv_blocks;
  kv.block_size = hello->block_size;
  auto worker_dev = StageWorker::create(std::move(*backend), std::move(*model), kv);
  if (!worker_dev) return refuse(worker_dev.error().message);
  // The socket outlives the actors' use of it: the writer holds it until it exits.
  auto shared = std::shared_ptr<link::Socket>(&socket, [](link::Socket*) {});
  auto writer = sys.spawn<caf::detached>(link_writer_fn, shared);
  auto worker = sys.spawn<caf::detached>(worker_fn, *worker_dev);
  worker_dev->reset();
  stage_actor next = hello->is_last ? stage_actor{} : caf::actor_cast<stage_actor>(writer);
  std::shared_ptr<const TokenBytes> tokens;  // JSON mode on this (last) stage's samplers
  if (hello->is_last && files.tokenizer) tokens = token_bytes(*files.tokenizer);
  auto stage = sys.spawn(stage_fn, worker, next, files.config.vocab, tokens);
  auto sink = caf::actor_cast<step_sink_actor>(writer);
  spdlog::info("stage ready: layers {}..{} of {} on {}, KV {} blocks of {} tokens", hello->layer_first,
               hello->layer_last, files.config.num_layers, device, kv.num_blocks, kv.block_size);
  NodeHelloReply ok{"", mine, device};
  Status ended;
  if (auto w = link::write_frame(socket, link::Frame::HelloReply, codec::encode(ok)); !w) {
    ended = w;
  } else {
    for (;;) {
      auto f = link::read_frame(socket, -1);
      if (!f) {
        ended = make_error(f.error().message);
        break;
      }
      if (f->first != link::Frame::Step) {
        ended = make_error("unexpected frame type " + std::to_string(static_cast<uint32_t>(f->first)));
        break;
      }
      auto step = codec::decode_stage_step(f->second);
      if (!step) {
        ended = make_error(step.error().message);
        break;
      }
      caf::anon_send(stage, std::move(*step), sink);
    }
  }
  // Stop the stage; wait until the writer is gone, so that nothing writes to the socket
  // after this returns (the caller closes it).
  socket.shutdown();
  caf::anon_send_exit(stage, caf::exit_reason::user_shutdown);
  {
    caf::scoped_actor self{sys};
    self->monitor(writer);
    self->monitor(worker);  // its exit frees the stage's weights and KV before the next head
    caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
    for (int i = 0; i < 2; ++i) self->receive([](const caf::down_msg&) {});
  }
  return ended;
}

}  // namespace troupe::actors
