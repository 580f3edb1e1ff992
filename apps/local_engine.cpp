#include "apps/local_engine.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace troupe::app {

actors::NodeOptions node_options(const ModelFlags& f) {
  actors::NodeOptions no;
  no.threads = f.threads;
  no.device = f.device;
  no.cuda = f.cuda_options();
  no.max_batch_tokens = f.batch;
  return no;
}

void ExpertFlags::add_to(CLI::App& app, bool with_key) {
  if (with_key)
    app.add_option("--node-key-file", key_file,
                   "file holding the shared node key, for expert workers on `troupe node`s (their --key-file)");
  app.add_option("--expert-parallel", parallel,
                 "mixture-of-experts models: run the routed experts on N expert-worker actors in this process, the "
                 "experts split into N even ranges (output is bit-identical to N = 0); 0: inside each stage")
      ->capture_default_str();
  app.add_option("--expert-placement", placement,
                 "mixture-of-experts models: a JSON file naming expert workers, the experts (and layers) each holds, "
                 "replicas, and workers on `troupe node`s (docs/moe.md); instead of --expert-parallel");
  app.add_option("--expert-threads", threads, "CPU threads per expert worker here (0: the cores over the workers)")
      ->capture_default_str();
  app.add_option("--expert-timeout", timeout,
                 "seconds an expert worker may take to answer one dispatch; past it (or when a worker's link breaks) "
                 "the step fails with an error naming the worker")
      ->capture_default_str();
}

Result<ExpertPlacement> ExpertFlags::placement_for(const ModelConfig& cfg) const {
  if (parallel > 0 && !placement.empty()) return make_error("give --expert-parallel or --expert-placement, not both");
  if (parallel < 0) return make_error("--expert-parallel must be >= 0");
  if (threads < 0 || threads > 1024) return make_error("--expert-threads must be 0..1024");
  if (!(timeout > 0 && timeout <= 3600)) return make_error("--expert-timeout must be in (0, 3600] seconds");
  return parallel > 0 ? ExpertPlacement::even(parallel, cfg) : ExpertPlacement::load(placement, cfg);
}

Status ExpertFlags::apply(const ModelConfig& cfg, actors::NodeOptions& no) const {
  if (!enabled()) return {};
  auto p = placement_for(cfg);
  if (!p) return p.error();
  bool remote = false;
  for (const auto& w : p->workers) remote |= !w.node.empty();
  if (remote) {
    if (key_file.empty()) return make_error("expert workers on nodes need the node key (--node-key-file)");
    auto key = link::read_key_file(key_file);
    if (!key) return key.error();
    no.expert_key = *key;
  }
  no.experts = std::move(*p);
  no.expert_threads = threads;
  no.expert_timeout_s = timeout;
  return {};
}

Result<std::unique_ptr<LocalEngine>> LocalEngine::start(const ModelFlags& flags, const LocalEngineOptions& opt) {
  if (flags.threads < 0 || flags.threads > 1024) return make_error("--threads must be 0..1024");
  if (flags.batch <= 0 || flags.batch > 65536) return make_error("--batch must be 1..65536");
  const auto t0 = std::chrono::steady_clock::now();
  auto files = open_model_files(flags);
  if (!files) return files.error();
  auto e = std::unique_ptr<LocalEngine>(new LocalEngine());
  e->files_ = std::make_shared<ModelFiles>(std::move(*files));
  ModelConfig& c = e->files_->config;
  c.max_context = std::min<int32_t>(c.max_context, flags.ctx);
  actors::NodeOptions no = node_options(flags);
  no.require_tokenizer = opt.require_tokenizer;
  no.scheduler.scheduler.max_batched_tokens = flags.batch;
  no.scheduler.scheduler.max_running = opt.max_running;
  no.scheduler.kv = kv_config_for_tokens(opt.kv_tokens, opt.block_size, opt.prefix_caching);
  no.scheduler.heartbeat = std::chrono::milliseconds(0);
  TROUPE_TRY(opt.experts.apply(c, no));
  configure_actor_system(e->cfg_);
  e->sys_ = std::make_unique<caf::actor_system>(e->cfg_);
  auto node =
      actors::spawn_local_node(*e->sys_, *e->files_, no, [](size_t d, size_t t) { progress_bar("loading", d, t); });
  if (!node) return node.error();
  e->node_ = std::move(*node);
  e->started_ = true;
  e->device_ = e->node_.backends.empty() ? flags.device : e->node_.backends.front();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("loaded {} ({}, {}): {}, on {} in {:.2f} s", e->files_->path, e->files_->format, c.arch,
               shape_summary(c), e->device_, secs);
  return e;
}

LocalEngine::~LocalEngine() {
  if (started_) node_.stop();
}

Status LocalEngine::run_seq(SeqRequest r, const std::function<bool(const actors::SeqEvent&)>& on_event) {
  caf::scoped_actor self{*sys_};
  const int64_t id = r.id;
  self->send(node_.scheduler, std::move(r), caf::actor_cast<actors::request_sink_actor>(self));
  for (;;) {
    bool finished = false, timed_out = false;
    std::string error;
    // A step takes milliseconds to seconds; ten minutes without one means the engine is gone.
    self->receive(
        [&](actors::SeqEvent& ev) {
          if (ev.seq_id != id) return;
          if (!ev.error.empty()) {
            error = ev.error;
            return;
          }
          if (!on_event(ev)) {
            self->send(node_.scheduler, actors::CancelSeqs{{id}});
            finished = true;
            return;
          }
          finished = ev.finished;
        },
        caf::after(std::chrono::minutes(10)) >> [&] { timed_out = true; });
    if (!error.empty()) return make_error(error);
    if (timed_out) {
      self->send(node_.scheduler, actors::CancelSeqs{{id}});
      return make_error("the engine produced no token in 10 minutes");
    }
    if (finished) return {};
  }
}

}  // namespace troupe::app
