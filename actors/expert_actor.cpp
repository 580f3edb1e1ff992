#include "actors/expert_actor.h"

#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "actors/codec.h"

namespace troupe::actors {

ExpertResult run_expert_dispatch(ExpertWorker& w, const ExpertDispatch& d) {
  const auto t0 = std::chrono::steady_clock::now();
  ExpertResult r;
  r.id = d.id;
  r.layer = d.layer;
  Status ok;
  try {
    r.rows.resize(d.rows.size());
    ok = w.shard->run(d.layer, d.experts, d.counts, d.rows.data(), d.rows.size(), r.rows.data());
  } catch (const std::exception& e) {  // (bad_alloc, ...): this dispatch fails, the worker lives on
    ok = make_error(std::string("expert worker: ") + e.what());
  }
  if (!ok) {
    r.rows.clear();
    r.error = ok.error().message;
  }
  r.compute_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (w.backend) w.backend->idle();  // the next dispatch is a stage's layer away: leave the cores to it
  return r;
}

expert_actor::behavior_type expert_fn(expert_actor::pointer, std::shared_ptr<ExpertWorker> worker) {
  return {
      [worker](const ExpertDispatch& d) -> ExpertResult { return run_expert_dispatch(*worker, d); },
  };
}

// ---- the router ----------------------------------------------------------------------------

ExpertRouter::ExpertRouter(caf::actor_system& sys, std::vector<Target> workers,
                           std::vector<std::vector<std::vector<int32_t>>> replicas, std::chrono::milliseconds timeout,
                           std::shared_ptr<MoeStats> stats)
    : sys_(sys),
      workers_(std::move(workers)),
      replicas_(std::move(replicas)),
      timeout_(timeout),
      stats_(std::move(stats)),
      experts_(workers_.size()),
      counts_(workers_.size()),
      load_(workers_.size()),
      holders_(replicas_.size(), 0) {
  for (size_t l = 0; l < replicas_.size(); ++l) {
    std::vector<bool> holds(workers_.size(), false);
    for (const auto& reps : replicas_[l])
      for (int32_t r : reps)
        if (r >= 0 && static_cast<size_t>(r) < holds.size()) holds[r] = true;
    for (bool h : holds) holders_[l] += h ? 1 : 0;
  }
}

ExpertRouter::~ExpertRouter() = default;

Status ExpertRouter::run(const ExpertWork& w) {
  if (w.layer < 0 || static_cast<size_t>(w.layer) >= replicas_.size() ||
      replicas_[w.layer].size() != static_cast<size_t>(w.num_experts))
    return make_error("expert parallelism: layer " + std::to_string(w.layer) + " has no placement");
  if (!self_ || owner_ != std::this_thread::get_id()) {
    self_ = std::make_unique<caf::scoped_actor>(sys_);
    owner_ = std::this_thread::get_id();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const size_t W = workers_.size();
  for (size_t i = 0; i < W; ++i) {
    experts_[i].clear();
    counts_[i].clear();
    load_[i] = 0;
  }
  // Each expert with rows to its least loaded replica (experts in ascending order).
  for (int32_t e = 0; e < w.num_experts; ++e) {
    const int32_t cnt = w.offsets[e + 1] - w.offsets[e];
    if (cnt <= 0) continue;
    const auto& reps = replicas_[w.layer][e];
    if (reps.empty())
      return make_error("expert parallelism: expert " + std::to_string(e) + " of layer " + std::to_string(w.layer) +
                        " is on no worker");
    int32_t best = reps[0];
    for (int32_t r : reps)
      if (load_[r] < load_[best]) best = r;
    experts_[best].push_back(e);
    counts_[best].push_back(cnt);
    load_[best] += cnt;
  }
  // One dispatch per worker with rows, all in flight at once.
  const int64_t H = w.hidden;
  using handle_t = decltype((*self_)->request(std::declval<expert_actor>(), timeout_, std::declval<ExpertDispatch>()));
  std::vector<std::pair<size_t, handle_t>> sent;
  std::vector<uint64_t> ids(W, 0);
  uint64_t bytes_out = 0, bytes_in = 0;
  int64_t busiest = 0, total = 0;
  const int64_t holders = holders_[w.layer];
  for (size_t i = 0; i < W; ++i) {
    if (experts_[i].empty()) continue;
    ExpertDispatch d;
    d.id = ids[i] = next_id_++;
    d.layer = w.layer;
    d.experts = experts_[i];
    d.counts = counts_[i];
    d.rows.reserve(static_cast<size_t>(load_[i] * H));
    for (int32_t e : experts_[i])
      d.rows.insert(d.rows.end(), w.x + int64_t{w.offsets[e]} * H, w.x + int64_t{w.offsets[e + 1]} * H);
    bytes_out += d.rows.size() * sizeof(float) + (d.experts.size() + d.counts.size()) * sizeof(int32_t);
    busiest = std::max(busiest, load_[i]);
    total += load_[i];
    const auto deadline = workers_[i].timeout.count() > 0 ? workers_[i].timeout : timeout_;
    sent.emplace_back(i, (*self_)->request(workers_[i].actor, deadline, std::move(d)));
  }
  if (caller_) caller_->idle();  // the stage's helper threads sleep while the workers compute
  std::string failed;
  double compute = 0;
  for (auto& [i, h] : sent) {
    const Target& t = workers_[i];
    std::move(h).receive(
        [&, i = i](ExpertResult& r) {
          if (!failed.empty()) return;
          if (!r.error.empty()) {
            failed = t.name + ": " + r.error;
          } else if (r.id != ids[i] || r.layer != w.layer || r.rows.size() != static_cast<size_t>(load_[i] * H)) {
            failed = t.name + ": its answer does not match the dispatch (rows, layer or id)";
          } else {
            int64_t off = 0;
            for (int32_t e : experts_[i]) {
              const int64_t n = (w.offsets[e + 1] - w.offsets[e]) * H;
              std::copy(r.rows.begin() + off, r.rows.begin() + off + n, w.y + int64_t{w.offsets[e]} * H);
              off += n;
            }
            bytes_in += r.rows.size() * sizeof(float);
            compute += std::isfinite(r.compute_seconds) && r.compute_seconds >= 0 ? r.compute_seconds : 0.0;
          }
        },
        [&](caf::error& err) {
          if (!failed.empty()) return;
          if (err == caf::sec::request_timeout)
            failed = t.name + ": no answer within " +
                     std::to_string((t.timeout.count() > 0 ? t.timeout : timeout_).count() / 1000.0).substr(0, 5) +
                     " s";
          else if (err == caf::sec::request_receiver_down)
            failed = t.name + ": the worker is gone";
          else
            failed = t.name + ": " + sys_.render(err);
        });
  }
  if (!failed.empty()) return make_error(failed);
  if (stats_) {
    const double mean = holders > 0 ? static_cast<double>(total) / static_cast<double>(holders) : 0.0;
    stats_->add_dispatch(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), compute,
                         bytes_out, bytes_in, mean > 0 ? static_cast<double>(busiest) / mean : 0.0);
  }
  return {};
}

// ---- workers on other nodes ----------------------------------------------------------------

namespace {

using expert_tick_atom = caf::atom_constant<caf::atom("exptick")>;
using remote_expert_actor =
    expert_actor::extend<caf::reacts_to<expert_tick_atom>, caf::reacts_to<link_scheduler_atom, scheduler_actor>>;

struct RemoteExpertState {
  RemoteExpertState() = default;  // not an aggregate (CAF)
  std::shared_ptr<link::Socket> socket;
  std::string node_name, down;  // down non-empty: the link is gone, and why
  RemoteStageOptions opts;
  NodeHello hello;
  int32_t hidden = 0;
  scheduler_actor scheduler;
  bool told_down = false;
  int retries = 0;
  static inline const char* name = "remote-expert";
};

}  // namespace

expert_actor spawn_remote_expert(caf::actor_system& sys, std::shared_ptr<link::Socket> socket, std::string name,
                                 const RemoteStageOptions& opts, const NodeHello& hello, int32_t hidden) {
  using self_ptr = remote_expert_actor::stateful_pointer<RemoteExpertState>;
  auto fn = [](self_ptr self, std::shared_ptr<link::Socket> sock, std::string nm, RemoteStageOptions o, NodeHello h,
               int32_t hid) -> remote_expert_actor::behavior_type {
    auto& st = self->state;
    st.socket = std::move(sock);
    st.node_name = std::move(nm);
    st.opts = std::move(o);
    st.hello = std::move(h);
    st.hidden = hid;
    const int timeout_ms = static_cast<int>(st.opts.step_timeout_s * 1000);
    st.socket->set_send_timeout(timeout_ms);
    auto go_down = [self](const std::string& why) {
      auto& st = self->state;
      if (!st.down.empty()) return;
      st.down = st.node_name + ": " + why;
      spdlog::error("{}", st.down);
      if (st.socket) st.socket->shutdown();
      st.socket.reset();
      st.retries = 0;
      if (st.scheduler) {
        self->send(st.scheduler, stage_down_atom::value, st.down);
        st.told_down = true;
      }
    };
    self->delayed_send(self, std::chrono::seconds(1), expert_tick_atom::value);
    return {
        [=](const ExpertDispatch& d) -> ExpertResult {
          auto& st = self->state;
          ExpertResult r;
          r.id = d.id;
          r.layer = d.layer;
          // The first failure's text is the one the scheduler hears (stage_down_atom) and the
          // one the failed step carries (the router puts the same name in front), so the
          // engine recovers when the node is back.
          auto fail = [&](const std::string& why) {
            go_down(why);
            r.error = why;
            return r;
          };
          if (!st.down.empty()) {
            r.error = "the worker is down (" + st.down + ")";
            return r;
          }
          if (auto ok = link::write_frame(*st.socket, link::Frame::ExpertDispatch, codec::encode(d)); !ok) {
            return fail("connection lost: " + ok.error().message);
          }
          auto f = link::read_frame(*st.socket, timeout_ms);
          if (!f) { return fail("no answer to a dispatch: " + f.error().message); }
          if (f->first != link::Frame::ExpertResult) {
            return fail("unexpected frame type " + std::to_string(static_cast<uint32_t>(f->first)));
          }
          auto res = codec::decode_expert_result(f->second);
          if (!res) { return fail("bad answer: " + res.error().message); }
          // (the router checks the rows against the dispatch)
          if (res->id != d.id) { return fail("an answer to another dispatch"); }
          return std::move(*res);
        },
        [=](link_scheduler_atom, scheduler_actor s) {
          auto& st = self->state;
          st.scheduler = std::move(s);
          if (!st.down.empty() && !st.told_down) {
            self->send(st.scheduler, stage_down_atom::value, st.down);
            st.told_down = true;
          }
        },
        [=](expert_tick_atom) {
          auto& st = self->state;
          if (st.down.empty()) {
            // Idle: nothing may arrive unasked, so anything readable is the node closing the link.
            pollfd p{st.socket->fd(), POLLIN | POLLRDHUP, 0};
            if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
              go_down("connection lost (the node closed the link)");
          } else {
            auto sock = connect_stage_node(st.opts, st.hello);
            if (!sock) {
              if (st.retries++ % 30 == 0) spdlog::warn("{}: reconnecting: {}", st.node_name, sock.error().message);
            } else {
              spdlog::info("{}: the node is back (after {} failed attempt(s))", st.node_name, st.retries);
              st.socket = std::move(*sock);
              st.socket->set_send_timeout(timeout_ms);
              st.down.clear();
              // (every failure this worker caused begins with its name: the router's timeouts too)
              if (st.scheduler && st.told_down) self->send(st.scheduler, stage_rejoined_atom::value, st.node_name);
              st.told_down = false;
            }
          }
          self->delayed_send(self, std::chrono::seconds(1), expert_tick_atom::value);
        },
    };
  };
  auto a = sys.spawn<caf::detached>(fn, std::move(socket), std::move(name), opts, hello, hidden);
  return caf::actor_cast<expert_actor>(a);
}

Status serve_expert_link(caf::actor_system& sys, link::Socket& socket, const ModelFiles& files,
                         const StageNodeOptions& opt, const NodeHello& hello, const std::string& mine) {
  auto refuse = [&](const std::string& why) -> Status {
    NodeHelloReply r{why, mine, ""};
    (void)link::write_frame(socket, link::Frame::HelloReply, codec::encode(r));
    return make_error("refused the head's experts: " + why);
  };
  const ModelConfig& c = files.config;
  if (hello.version != 1) return refuse("link version " + std::to_string(hello.version) + " (this node speaks 1)");
  if (hello.model != mine) return refuse("another model (head: " + hello.model + "; node: " + mine + ")");
  if (!c.moe.enabled()) return refuse("this node's model has no experts");
  const int64_t limit = int64_t{opt.max_batch_tokens} * c.moe.experts_per_tok;
  if (hello.max_expert_rows < 1 || hello.max_expert_rows > limit)
    return refuse("dispatches of " + std::to_string(hello.max_expert_rows) + " rows (this node's --batch allows " +
                  std::to_string(limit) + ")");
  auto backend = make_backend(opt.device, opt.threads, opt.cuda);
  if (!backend) return refuse(backend.error().message);
  auto w = std::make_shared<ExpertWorker>();
  w->name = "expert worker";
  w->backend = std::move(*backend);
  auto shard = ExpertShard::build(c, *files.weights, *w->backend, hello.max_expert_rows, hello.experts);
  if (!shard) return refuse(shard.error().message);
  w->shard = std::move(*shard);
  const std::string device = w->backend->name();
  size_t count = 0;
  for (const auto& [l, ids] : hello.experts) count += ids.size();
  auto actor = sys.spawn<caf::detached>(expert_fn, w);
  w.reset();
  spdlog::info("expert worker ready: {} layer-experts over {} layers on {}", count, hello.experts.size(), device);
  NodeHelloReply ok{"", mine, device};
  Status ended;
  caf::scoped_actor self{sys};
  if (auto wr = link::write_frame(socket, link::Frame::HelloReply, codec::encode(ok)); !wr) {
    ended = wr;
  } else {
    for (;;) {
      auto f = link::read_frame(socket, -1);
      if (!f) {
        ended = make_error(f.error().message);
        break;
      }
      if (f->first != link::Frame::ExpertDispatch) {
        ended = make_error("unexpected frame type " + std::to_string(static_cast<uint32_t>(f->first)));
        break;
      }
      auto d = codec::decode_expert_dispatch(f->second);
      if (!d) {
        ended = make_error(d.error().message);
        break;
      }
      ExpertResult res;
      self->request(actor, caf::infinite, std::move(*d))
          .receive([&](ExpertResult& r) { res = std::move(r); },
                   [&](caf::error& e) { res.error = "expert worker: " + sys.render(e); });
      if (auto wr = link::write_frame(socket, link::Frame::ExpertResult, codec::encode(res)); !wr) {
        ended = wr;
        break;
      }
    }
  }
  self->monitor(actor);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  self->receive([](const caf::down_msg&) {});  // its exit frees the experts before the next head
  return ended;
}

}  // namespace troupe::actors
