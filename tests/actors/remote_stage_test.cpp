// The head's proxy for a stage on another node (actors/remote_stage.h) against a fake node
// on loopback that answers however the test says: correct answers pass through; a result
// with a token outside the vocabulary or for other rows, or activations of the wrong size,
// fail the step and the link (never reach the scheduler or the next stage); the plan a
// middle stage's activations travel with is the one the head sent, whatever the node
// wrote into its copy.
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <functional>
#include <thread>

#include "actors/codec.h"
#include "actors/remote_stage.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

const std::string kKey = "a key for the fake node, 16+ bytes";

// Accepts one head, authenticates, accepts its hello, then answers each step with
// `answer(step)`; closes its listener after the one connection (reconnects are refused).
class FakeNode {
 public:
  using Answer = std::function<std::pair<link::Frame, codec::Bytes>(const StageStep&)>;
  explicit FakeNode(Answer answer) {
    auto p = listener_.listen("127.0.0.1", 0);
    REQUIRE(p.ok());
    port = *p;
    thread_ = std::thread([this, answer] {
      auto s = listener_.accept(10000);
      listener_.close();  // no second connection
      if (!s || !link::authenticate_as_node(*s, kKey)) return;
      auto hello = link::read_frame(*s, 5000);
      if (!hello) return;
      auto h = codec::decode_node_hello(hello->second);
      NodeHelloReply r{"", h ? h->model : "", "fake"};
      if (!link::write_frame(*s, link::Frame::HelloReply, codec::encode(r))) return;
      for (;;) {
        auto f = link::read_frame(*s, 10000);
        if (!f) return;
        auto step = codec::decode_stage_step(f->second);
        if (!step) return;
        auto [type, bytes] = answer(*step);
        if (!link::write_frame(*s, type, bytes)) return;
      }
    });
  }
  ~FakeNode() { thread_.join(); }
  int port = 0;

 private:
  link::Listener listener_;
  std::thread thread_;
};

StageStep make_step(uint64_t no, bool with_hidden) {
  StageStep s;
  s.step_no = no;
  s.token_ids = {11, 12, 13};
  s.positions = {0, 1, 2};
  s.query_start = {0, 3};
  s.context_lens = {3};
  s.slot_mapping = {0, 1, 2};
  s.max_blocks_per_seq = 1;
  s.block_tables = {0};
  s.logit_rows = {2};
  s.logit_seq = {42};
  if (with_hidden) s.hidden.assign(3 * 4, 0.5f);
  return s;
}

stage_actor connect(caf::actor_system& sys, int port, stage_actor next) {
  RemoteStageOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.key = kKey;
  o.step_timeout_s = 10;
  NodeHello h;
  h.model = "fake model";
  h.layer_first = 1;
  h.layer_last = 2;
  h.is_last = !next;
  auto sock = connect_stage_node(o, h);
  REQUIRE(sock.ok());
  return spawn_remote_stage(sys, *sock, std::move(next), "stage 1 on the fake node", o, h, /*vocab=*/100, /*hidden=*/4);
}

// Stops the proxy when the test leaves, also through a failed REQUIRE (the actor system
// waits for it, and it would keep reconnecting).
struct Stop {
  stage_actor a;
  ~Stop() { caf::anon_send_exit(a, caf::exit_reason::user_shutdown); }
};

}  // namespace

TEST_CASE("remote stage: results are checked before they reach the scheduler", "[link][actors]") {
  caf::actor_system_config cfg;
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  caf::scoped_actor sink{sys};
  auto sink_h = caf::actor_cast<step_sink_actor>(sink);
  {
    FakeNode node([](const StageStep& s) {
      StepDone d;
      d.step_no = s.step_no;
      SampleResult r;
      r.token = s.step_no == 1 ? 7 : 100;  // step 2: just outside the vocabulary of 100
      d.sampled.push_back({s.logit_seq.at(0), r});
      return std::make_pair(link::Frame::StepResult, codec::encode(d));
    });
    auto proxy = connect(sys, node.port, {});
    Stop stop{proxy};
    caf::anon_send(proxy, make_step(1, true), sink_h);
    bool got = false;
    sink->receive([&](StepDone& d) { got = d.step_no == 1 && d.sampled.size() == 1 && d.sampled[0].result.token == 7; },
                  [&](StepFailed& f) { FAIL("step 1 failed: " << f.error); },
                  caf::after(std::chrono::seconds(10)) >> [] { FAIL("no answer to step 1"); });
    REQUIRE(got);
    caf::anon_send(proxy, make_step(2, true), sink_h);
    std::string error;
    sink->receive([&](StepDone&) { FAIL("a token outside the vocabulary was passed on"); },
                  [&](StepFailed& f) { error = f.error; },
                  caf::after(std::chrono::seconds(10)) >> [] { FAIL("no answer to step 2"); });
    REQUIRE(error.find("invalid step result") != std::string::npos);
    REQUIRE(error.find("outside the vocabulary") != std::string::npos);
    // the link is down now: a later step fails at once with the same cause
    caf::anon_send(proxy, make_step(3, true), sink_h);
    sink->receive([&](StepFailed& f) { REQUIRE(f.error == error); },
                  caf::after(std::chrono::seconds(10)) >> [] { FAIL("no answer to step 3"); });
  }
}

TEST_CASE("remote stage: a middle stage adds activations to the plan the head sent", "[link][actors]") {
  caf::actor_system_config cfg;
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  caf::scoped_actor sink{sys}, next{sys};
  auto sink_h = caf::actor_cast<step_sink_actor>(sink);
  FakeNode node([](const StageStep& s) {
    StageStep out = s;
    out.block_tables = {77};  // a faulty node rewrites the plan...
    out.token_ids = {1, 1, 1};
    out.hidden.assign(s.step_no == 1 ? 3 * 4 : 5, 2.0f);  // ...and step 2's activations are short
    return std::make_pair(link::Frame::Activations, codec::encode(out));
  });
  auto proxy = connect(sys, node.port, caf::actor_cast<stage_actor>(next));
  Stop stop{proxy};
  caf::anon_send(proxy, make_step(1, true), sink_h);
  bool got = false;
  next->receive(
      [&](StageStep& s, step_sink_actor) {
        got = s.step_no == 1 && s.block_tables == std::vector<int32_t>{0} &&
              s.token_ids == std::vector<int32_t>{11, 12, 13} && s.hidden == std::vector<float>(12, 2.0f);
      },
      caf::after(std::chrono::seconds(10)) >> [] { FAIL("no activations for step 1"); });
  REQUIRE(got);
  caf::anon_send(proxy, make_step(2, true), sink_h);
  std::string error;
  sink->receive([&](StepFailed& f) { error = f.error; },
                caf::after(std::chrono::seconds(10)) >> [] { FAIL("no failure for step 2"); });
  REQUIRE(error.find("invalid activations") != std::string::npos);
}
