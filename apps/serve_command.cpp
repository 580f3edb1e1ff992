// `troupe serve`: the OpenAI-compatible service node. The HTTP server binds first (so
// /health answers 503 while the model loads), then the node's actors are built and
// attached. SIGTERM/SIGINT drain: health turns 503, new requests get 503 with
// Retry-After, requests in flight finish (or are cancelled at --drain-timeout), exit 0.
#include <spdlog/spdlog.h>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fstream>
#include <thread>

#include "actors/local_node.h"
#include "actors/worker_actor.h"
#include "apps/common.h"
#include "apps/local_engine.h"
#include "apps/serve/openai_server.h"
#include "apps/subcommands.h"
#include "runtime/spec/draft_source.h"
#include "sim/step_log.h"

namespace troupe::app {
namespace {

struct ServeFlags {
  ModelFlags model;
  std::string model_positional;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 0;  // 0: --batch
  int kv_cache_tokens = 32768;
  int block_size = 16;
  bool no_prefix_caching = false;
  bool no_chunked_prefill = false;
  double itl_target_ms = 100;  // 0: off
  std::string policy = "fcfs";
  int pipeline_stages = 1;
  int tokenizer_actors = 1;
  int http_threads = 1;
  int max_queue = 256;
  double drain_timeout = 30;
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 16u << 10;
  int read_timeout = 30;
  int max_connections = 1024;
  uint64_t debug_fail_step = 0, debug_hang_step = 0;
  double stall_timeout = 120;
  std::vector<std::string> remote_stages;  // "K=HOST:PORT"
  std::string node_key_file;
  double node_timeout = 30;
  ExpertFlags experts;
  std::string step_log;            // --step-log FILE
  std::string speculative;         // --speculative METHOD ("": off)
  int num_speculative_tokens = 7;  // 1 + 7 tokens: one streaming tile of the AVX-512 matmul
  api::Limits limits;
};

Status validate(const ServeFlags& f) {
  if (f.port < 0 || f.port > 65535) return make_error("--port must be 0..65535");
  if (f.max_num_seqs < 1 || f.max_num_seqs > 4096) return make_error("--max-num-seqs must be 1..4096");
  if (f.kv_cache_tokens < 16 || f.kv_cache_tokens > (1 << 24)) return make_error("--kv-cache-tokens must be 16..16M");
  if (f.block_size < 1 || f.block_size > 256) return make_error("--block-size must be 1..256");
  if (f.policy != "fcfs" && f.policy != "priority") return make_error("--scheduling-policy must be fcfs or priority");
  if (f.max_queue < 0) return make_error("--max-queue must be >= 0");
  if (!(f.itl_target_ms >= 0 && f.itl_target_ms <= 600000)) return make_error("--itl-target-ms must be 0..600000");
  if (!(f.drain_timeout >= 0 && f.drain_timeout <= 3600)) return make_error("--drain-timeout must be 0..3600 seconds");
  if (f.read_timeout < 1 || f.read_timeout > 3600) return make_error("--read-timeout must be 1..3600 seconds");
  if (f.http_threads < 1 || f.http_threads > 64) return make_error("--http-threads must be 1..64");
  if (!(f.stall_timeout >= 0 && f.stall_timeout <= 86400))
    return make_error("--stall-timeout must be 0..86400 seconds");
  if (f.max_connections < 1 || f.max_connections > 1000000) return make_error("--max-connections must be 1..1000000");
  if (f.max_body_bytes < 1024 || f.max_header_bytes < 1024)
    return make_error("body and header limits must be at least 1024 bytes");
  if (!(f.node_timeout >= 0.5 && f.node_timeout <= 3600)) return make_error("--node-timeout must be 0.5..3600 seconds");
  if (!f.remote_stages.empty() && f.node_key_file.empty()) return make_error("--remote-stage needs --node-key-file");
  if (f.limits.max_n < 1 || f.limits.max_n > 256) return make_error("--max-n must be 1..256");
  if (f.limits.max_top_logprobs < 0 || f.limits.max_top_logprobs > 100)
    return make_error("--max-top-logprobs must be 0..100");
  if (f.limits.max_stop < 0 || f.limits.max_stop > 64) return make_error("--max-stop must be 0..64");
  if (f.limits.max_stop_len < 1 || f.limits.max_stop_len > 4096) return make_error("--max-stop-len must be 1..4096");
  if (f.num_speculative_tokens < 1 || f.num_speculative_tokens > kMaxSpeculativeTokens)
    return make_error("--num-speculative-tokens must be 1.." + std::to_string(kMaxSpeculativeTokens));
  if (!f.speculative.empty())
    if (auto d = make_draft_source(f.speculative); !d) return make_error("--speculative: " + d.error().message);
  return {};
}

std::string default_name(const std::string& path) {
  std::string n = path.substr(path.find_last_of('/') + 1);
  if (n.size() > 5 && n.compare(n.size() - 5, 5, ".gguf") == 0) n.resize(n.size() - 5);
  return n.empty() ? "model" : n;
}

int serve(ServeFlags f) {
  if (!f.model_positional.empty()) f.model.model = f.model_positional;
  if (auto ok = validate(f); !ok) {
    spdlog::error("{}", ok.error().message);
    return 2;
  }
  if (!is_loopback(f.host) && f.api_key.empty())
    spdlog::warn("binding {} without --api-key: anyone who can reach this port can use the model", f.host);
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system sys{cfg};

  boost::asio::io_context io;
  serve::ServerOptions so;
  so.api_key = f.api_key;
  so.block_size = f.block_size;
  so.limits = f.limits;
  serve::OpenAiServer server(sys, so);
  serve::HttpLimits hl{f.max_body_bytes, f.max_header_bytes, f.read_timeout};
  // Every connection holds a descriptor: the open-file limit must leave room for them all
  // (raised where the hard limit allows), or accepting would fail once it is reached.
  long nofile = 0;
  constexpr int kReservedFds = 64;
  hl.max_connections = serve::fit_connections(f.max_connections, kReservedFds, &nofile);
  if (hl.max_connections < 1) {
    spdlog::error(
        "the open-file limit ({}) leaves no room for connections beside {} other descriptors; raise it "
        "(ulimit -n)",
        nofile, kReservedFds);
    return 1;
  }
  if (hl.max_connections < f.max_connections)
    spdlog::warn(
        "--max-connections {} lowered to {}: the open-file limit is {} (hard limit reached; raise it with ulimit -Hn)",
        f.max_connections, hl.max_connections, nofile);
  serve::HttpServer http(io, hl, [&server](std::shared_ptr<serve::Exchange> ex) { server.handle(ex); });
  unsigned short port = 0;
  try {
    port = http.listen(f.host, static_cast<unsigned short>(f.port));
  } catch (const std::exception& e) {
    spdlog::error("cannot listen on {}:{}: {}", f.host, f.port, e.what());
    return 1;
  }
  spdlog::info("listening on http://{}:{} (loading the model; /health answers 503 until ready)", f.host, port);
  std::vector<std::thread> threads;
  auto guard = boost::asio::make_work_guard(io);
  for (int i = 0; i < f.http_threads; ++i) threads.emplace_back([&io] { io.run(); });
  auto finish = [&](int code) {
    guard.reset();
    io.stop();
    for (auto& t : threads) t.join();
    return code;
  };

  // Load the model and build the node.
  auto files = open_model_files(f.model);
  if (!files) {
    spdlog::error("{}", files.error().message);
    return finish(1);
  }
  auto mf = std::make_shared<ModelFiles>(std::move(*files));
  mf->config.max_context = std::min<int32_t>(mf->config.max_context, f.model.ctx);
  actors::NodeOptions no = node_options(f.model);
  no.num_stages = f.pipeline_stages;
  no.num_tokenizers = f.tokenizer_actors;
  no.fail_step = f.debug_fail_step;
  no.hang_step = f.debug_hang_step;
  if (!f.remote_stages.empty()) {
    auto key = link::read_key_file(f.node_key_file);
    if (!key) {
      spdlog::error("{}", key.error().message);
      return finish(2);
    }
    for (const std::string& spec : f.remote_stages) {
      const size_t eq = spec.find('=');
      const std::string k = eq == std::string::npos ? std::string() : spec.substr(0, eq);
      auto hp = eq == std::string::npos ? Result<std::pair<std::string, int>>(make_error("no '='"))
                                        : actors::parse_host_port(spec.substr(eq + 1));
      if (k.empty() || k.size() > 4 || k.find_first_not_of("0123456789") != std::string::npos || !hp) {
        spdlog::error("--remote-stage {}: expected STAGE=HOST:PORT, for example 1=10.0.0.2:7433", spec);
        return finish(2);
      }
      actors::RemoteStageOptions ro;
      ro.host = hp->first;
      ro.port = hp->second;
      ro.key = *key;
      ro.step_timeout_s = f.node_timeout;
      if (!no.remote_stages.emplace(std::stoi(k), ro).second) {
        spdlog::error("--remote-stage: stage {} named twice", k);
        return finish(2);
      }
    }
  }
  ExpertFlags ef = f.experts;
  ef.key_file = f.node_key_file;
  if (auto ok = ef.apply(mf->config, no); !ok) {
    spdlog::error("{}", ok.error().message);
    return finish(2);
  }
  if (f.debug_fail_step != 0)
    spdlog::warn("--debug-fail-step {}: that engine step will fail on purpose (fault injection for tests)",
                 f.debug_fail_step);
  if (f.debug_hang_step != 0)
    spdlog::warn("--debug-hang-step {}: that engine step will hang until shutdown (fault injection for tests)",
                 f.debug_hang_step);
  no.scheduler.scheduler.max_batched_tokens = f.max_num_batched_tokens > 0 ? f.max_num_batched_tokens : f.model.batch;
  no.scheduler.scheduler.max_running = f.max_num_seqs;
  no.scheduler.scheduler.chunked_prefill = !f.no_chunked_prefill;
  no.scheduler.scheduler.itl_target_s = f.itl_target_ms / 1000;
  if (!f.speculative.empty()) {
    auto d = make_draft_source(f.speculative);  // (validated above)
    if (!d) {
      spdlog::error("--speculative: {}", d.error().message);
      return finish(2);
    }
    no.scheduler.draft = std::move(*d);
    no.scheduler.scheduler.num_speculative_tokens = f.num_speculative_tokens;
    so.limits.num_speculative_tokens = f.num_speculative_tokens;
    spdlog::info("speculative decoding: {}, at most {} draft tokens a step", f.speculative, f.num_speculative_tokens);
  }
  no.scheduler.kv = kv_config_for_tokens(f.kv_cache_tokens, f.block_size, !f.no_prefix_caching);
  no.scheduler.policy = f.policy == "priority" ? SchedulingPolicy::priority() : SchedulingPolicy::fcfs();
  if (!f.step_log.empty()) {
    auto log = std::make_shared<std::ofstream>(f.step_log);
    if (!*log) {
      spdlog::error("--step-log: cannot write '{}'", f.step_log);
      return finish(2);
    }
    *log << sim::kStepLogHeader << std::flush;
    // (the scheduler actor's thread only; a line per step, flushed so a reader sees whole steps)
    no.scheduler.on_step = [log](const StepPlan& plan, double seconds, double compute) {
      std::vector<sim::SeqShape> seqs;
      seqs.reserve(plan.seqs.size());
      for (const auto& q : plan.seqs)
        seqs.push_back({q.num_computed, q.num_new, q.samples, static_cast<int32_t>(q.drafts.size())});
      *log << sim::step_log_line(seqs, seconds, compute) << std::flush;
    };
  }
  auto node = actors::spawn_local_node(sys, *mf, no, [](size_t d, size_t t) { progress_bar("loading", d, t); });
  if (!node) {
    spdlog::error("{}", node.error().message);
    return finish(1);
  }
  const std::string name = f.served_model_name.empty() ? default_name(mf->path) : f.served_model_name;
  so.model_name = name;
  so.limits.vocab_size = mf->config.vocab;
  so.limits.max_context = mf->config.max_context;
  so.limits.model_names = {name, f.model.model};
  so.max_active_seqs = f.max_num_seqs + f.max_queue;
  so.stall_timeout_seconds = f.stall_timeout;
  auto shared_node = std::make_shared<actors::LocalNode>(std::move(*node));
  server.attach(shared_node, so);
  spdlog::info("serving '{}' ({} layers, {} stage(s), context {}, KV {} blocks of {} tokens) on http://{}:{}", name,
               mf->config.num_layers, f.pipeline_stages, mf->config.max_context, no.scheduler.kv.num_blocks,
               f.block_size, f.host, port);

  // SIGTERM / SIGINT: drain, then stop.
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  boost::asio::steady_timer timer(io);
  std::chrono::steady_clock::time_point deadline;
  std::function<void()> poll = [&] {
    // Done when no request runs and every response has been written out (a request's
    // accounting ends before its last chunks, usage and [DONE], reach the socket).
    if ((server.active_requests() == 0 && http.responses_in_flight() == 0) ||
        std::chrono::steady_clock::now() >= deadline) {
      if (server.active_requests() > 0) {
        spdlog::warn("drain timeout: cancelling {} request(s)", server.active_requests());
        server.cancel_all();
      }
      http.stop_accepting();
      guard.reset();
      io.stop();
      return;
    }
    timer.expires_after(std::chrono::milliseconds(50));
    timer.async_wait([&](const boost::system::error_code&) { poll(); });
  };
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {}: draining ({} request(s) in flight, up to {} s)", sig, server.active_requests(),
                 f.drain_timeout);
    server.start_drain();
    deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(f.drain_timeout * 1000));
    poll();
  });
  for (auto& t : threads) t.join();
  actors::release_injected_hangs();  // (--debug-hang-step: the hung worker must let go to exit)
  shared_node->stop();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API (completions, chat, SSE streaming)");
  f->model.add_to(*cmd);
  cmd->add_option("model", f->model_positional, "model (same as --model)");
  cmd->add_option("--host", f->host, "address to bind (loopback by default; elsewhere, set --api-key)")
      ->capture_default_str();
  cmd->add_option("--port", f->port, "TCP port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--served-model-name", f->served_model_name, "model id in the API (default: the file name)");
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "most sequences in the running batch")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "token budget per step (0: --batch)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f->kv_cache_tokens, "KV-cache capacity in tokens, over all sequences")
      ->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "turn automatic prefix caching off");
  cmd->add_flag("--no-chunked-prefill", f->no_chunked_prefill,
                "compute each prompt in one step (waiting for room) instead of in chunks mixed with decodes; "
                "prompts longer than the token budget are refused");
  cmd->add_option(
         "--itl-target-ms", f->itl_target_ms,
         "inter-token latency target: while requests stream, a step's tokens are capped so that its time, as "
         "learned from past steps, stays within this or three times a step of the decodes alone (prefill then goes "
         "on in smaller chunks); 0: off, every step fills --max-num-batched-tokens; needs chunked prefill")
      ->capture_default_str();
  cmd->add_option("--scheduling-policy", f->policy, "fcfs, or priority (lower 'priority' runs first)")
      ->capture_default_str();
  cmd->add_option("--speculative", f->speculative,
                  "speculative decoding: 'ngram' (prompt lookup: tokens that followed the sequence's last 3-4 "
                  "tokens earlier in it are fed as drafts and verified in the same step), or 'self:L' (the "
                  "model's own first L layers, final norm and LM head draft, in rounds inside the step, over the "
                  "KV those layers already hold; one pipeline stage only); output unchanged either way; off when "
                  "not given");
  cmd->add_option("--num-speculative-tokens", f->num_speculative_tokens,
                  "most draft tokens one sequence feeds a step (each request may ask for fewer with "
                  "'num_speculative_tokens'); fewer are fed when their acceptance so far and the step time say "
                  "they cost more than they bring")
      ->capture_default_str();
  cmd->add_option("--pipeline-stages", f->pipeline_stages,
                  "pipeline-stage actors the layers are split over (with --device cuda:N,M,...: in contiguous groups, "
                  "one group per GPU)")
      ->capture_default_str();
  cmd->add_option("--step-log", f->step_log,
                  "write every engine step (its sequences' computed+new tokens, seconds from plan to result, the "
                  "workers' compute seconds) to FILE as CSV, for `troupe sim calibrate --steps` and `sim validate`");
  cmd->add_option("--tokenizer-actors", f->tokenizer_actors, "tokenizer actors in the pool")->capture_default_str();
  cmd->add_option("--http-threads", f->http_threads, "threads running the HTTP server")->capture_default_str();
  cmd->add_option("--max-queue", f->max_queue, "sequences that may wait beyond --max-num-seqs before 429")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", f->drain_timeout, "seconds in-flight requests get after SIGTERM")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", f->max_body_bytes, "largest request body (413 above)")->capture_default_str();
  cmd->add_option("--max-header-bytes", f->max_header_bytes, "largest request header block (431 above)")
      ->capture_default_str();
  cmd->add_option("--read-timeout", f->read_timeout, "seconds a request's headers and body may take to arrive (408)")
      ->capture_default_str();
  cmd->add_option(
         "--max-connections", f->max_connections,
         "most open HTTP connections; one more is answered 503 and closed (the open-file limit is raised to fit, "
         "or this lowered)")
      ->capture_default_str();
  cmd->add_option("--debug-fail-step", f->debug_fail_step,
                  "fault injection for tests: engine step N fails as a broken device would (every running request "
                  "ends with an error, /health turns 503); 0: off")
      ->capture_default_str();
  cmd->add_option("--debug-hang-step", f->debug_hang_step,
                  "fault injection for tests: engine step N hangs, as a hung device would, until shutdown; 0: off")
      ->capture_default_str();
  cmd->add_option("--stall-timeout", f->stall_timeout,
                  "/health answers 503 ('engine stalled') while an engine step has run longer than this many seconds "
                  "(a hung device or worker; the scheduler's heartbeat alone would not show it); 0: off")
      ->capture_default_str();
  cmd->add_option("--remote-stage", f->remote_stages,
                  "run pipeline stage K on a stage node (troupe node) at HOST:PORT, as K=HOST:PORT; repeatable; K is "
                  "1..--pipeline-stages - 1 (stage 0 embeds here); the node must hold the same model file")
      ->take_all();
  cmd->add_option("--node-key-file", f->node_key_file,
                  "file holding the shared node key (the nodes' --key-file): both sides prove they hold it before any "
                  "message is decoded");
  cmd->add_option("--node-timeout", f->node_timeout,
                  "seconds a remote stage may take to answer a step; past it (or when its link breaks) the steps in "
                  "flight fail, their requests end with an error naming the node, and /health turns 503")
      ->capture_default_str();
  f->experts.add_to(*cmd, false);
  cmd->add_option("--max-n", f->limits.max_n, "largest 'n' (choices per prompt)")->capture_default_str();
  cmd->add_option("--max-top-logprobs", f->limits.max_top_logprobs, "largest 'top_logprobs'")->capture_default_str();
  cmd->add_option("--max-stop", f->limits.max_stop, "most stop strings per request")->capture_default_str();
  cmd->add_option("--max-stop-len", f->limits.max_stop_len, "longest stop string in bytes")->capture_default_str();
  cmd->callback([f] { set_exit_code(serve(*f)); });
}

}  // namespace troupe::app
