#include "actors/local_node.h"

#include <spdlog/spdlog.h>

#include <thread>

namespace troupe::actors {

void LocalNode::stop() {
  caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(kv, caf::exit_reason::user_shutdown);
  for (auto& s : stages) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  for (auto& e : experts) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  if (tokenizers)
    for (auto& t : tokenizers->actors()) caf::anon_send_exit(t, caf::exit_reason::user_shutdown);
}

Result<LocalNode> spawn_local_node(caf::actor_system& sys, const ModelFiles& files, NodeOptions opt,
                                   const ProgressFn& progress) {
  const ModelConfig& c = files.config;
  if (!files.tokenizer && opt.require_tokenizer) return make_error("the model has no tokenizer (serving needs one)");
  if (opt.num_stages < 1 || opt.num_stages > c.num_layers)
    return make_error("--pipeline-stages must be 1.." + std::to_string(c.num_layers) + " for this model");
  if (opt.num_tokenizers < 1 || opt.num_tokenizers > 64) return make_error("tokenizer pool size must be 1..64");
  if (opt.scheduler.scheduler.max_batched_tokens > opt.max_batch_tokens)
    return make_error("the token budget per step exceeds the model's max batch");
  // (before any actor is spawned, so a refusal leaves nothing behind)
  std::shared_ptr<const ChatTemplate> tmpl;
  if (!files.chat_template.empty()) {
    auto t = ChatTemplate::parse(files.chat_template);
    if (!t) return make_error("chat template: " + t.error().message);
    tmpl = std::make_shared<const ChatTemplate>(std::move(*t));
  }
  // Build every stage's worker first (the slow part), then spawn from the last stage back.
  auto stage_device = stage_devices(opt.device, opt.num_stages);
  if (!stage_device) return stage_device.error();
  for (const auto& [s, r] : opt.remote_stages)
    if (s < 1 || s >= opt.num_stages)
      return make_error("remote stage " + std::to_string(s) + ": must be 1.." + std::to_string(opt.num_stages - 1) +
                        " (stage 0 embeds the tokens here)");
  if (opt.remote_stages.count(opt.num_stages - 1) && (opt.fail_step != 0 || opt.hang_step != 0))
    return make_error("fault injection needs the last stage on this node");
  // Speculative decoding: the draft source checked against the model; a self-draft runs
  // inside the one worker that holds every layer, its LM head and all the KV.
  const int32_t self_draft = opt.scheduler.draft ? opt.scheduler.draft->self_draft_layers() : 0;
  if (opt.scheduler.draft)
    if (auto ok = opt.scheduler.draft->bind(draft_target(c)); !ok)
      return make_error("--speculative " + ok.error().message);
  if (self_draft > 0 && opt.num_stages != 1)
    return make_error("--speculative " + opt.scheduler.draft->name() +
                      ": a self-draft needs the whole model in one stage (not with --pipeline-stages)");
  const bool ep = opt.experts.has_value();
  if (ep && !c.moe.enabled()) return make_error("expert parallelism needs a mixture-of-experts model");
  if (ep && !opt.remote_stages.empty())
    return make_error("expert parallelism with pipeline stages on other nodes is not supported yet");
  if (ep && !opt.detached_workers) return make_error("expert parallelism needs detached workers");
  if (opt.expert_timeout_s <= 0 || opt.expert_timeout_s > 3600)
    return make_error("--expert-timeout must be in (0, 3600] s");
  std::vector<std::shared_ptr<StageWorker>> devices(static_cast<size_t>(opt.num_stages));
  size_t done_layers = 0;
  for (int32_t s = 0; s < opt.num_stages; ++s) {
    LayerRange r{c.num_layers * s / opt.num_stages, c.num_layers * (s + 1) / opt.num_stages};
    if (opt.remote_stages.count(s)) continue;
    auto made = make_backend((*stage_device)[static_cast<size_t>(s)], opt.threads, opt.cuda);
    if (!made) return made.error();
    auto backend = std::move(*made);
    const size_t before = done_layers;
    ProgressFn stage_progress;
    if (progress)
      stage_progress = [&, before](size_t d, size_t) { progress(before + d, static_cast<size_t>(c.num_layers) + 2); };
    auto model = Model::build(c, *files.weights, *backend, opt.max_batch_tokens, stage_progress, r, !ep);
    if (!model) return model.error();
    done_layers += static_cast<size_t>(r.last - r.first);
    auto w = StageWorker::create(std::move(backend), std::move(*model), opt.scheduler.kv);
    if (!w) return w.error();
    devices[static_cast<size_t>(s)] = std::move(*w);
  }
  // Expert workers: built here or connected (each `troupe node` builds its own experts).
  LocalNode node;
  std::vector<std::shared_ptr<ExpertWorker>> expert_devs;
  std::vector<std::shared_ptr<link::Socket>> expert_links;
  std::vector<NodeHello> expert_hellos;
  std::vector<RemoteStageOptions> expert_opts;
  if (c.moe.enabled()) node.moe = std::make_shared<MoeStats>(c.num_layers, c.moe.num_experts);
  if (ep) {
    const int32_t max_rows = opt.max_batch_tokens * c.moe.experts_per_tok;
    int32_t local = 0;
    for (const auto& w : opt.experts->workers) local += w.node.empty() ? 1 : 0;
    const int32_t cores =
        opt.threads > 0 ? opt.threads : std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
    const int32_t threads = opt.expert_threads > 0 ? opt.expert_threads : std::max(1, cores / std::max(1, local));
    for (const auto& pw : opt.experts->workers) {
      std::shared_ptr<ExpertWorker> dev;
      std::shared_ptr<link::Socket> sock;
      NodeHello h;
      RemoteStageOptions ro;
      if (pw.node.empty()) {
        dev = std::make_shared<ExpertWorker>();
        dev->name = pw.name;
        auto made = make_backend((*stage_device)[0], threads, opt.cuda);
        if (!made) return made.error();
        dev->backend = std::move(*made);
        auto shard = ExpertShard::build(c, *files.weights, *dev->backend, max_rows, pw.experts);
        if (!shard) return make_error("expert worker '" + pw.name + "': " + shard.error().message);
        dev->shard = std::move(*shard);
        spdlog::info("expert worker '{}' on {}", pw.name, dev->backend->name());
      } else {
        auto hp = parse_host_port(pw.node);
        if (!hp) return make_error("expert worker '" + pw.name + "': " + hp.error().message);
        ro.host = hp->first;
        ro.port = hp->second;
        ro.key = opt.expert_key;
        ro.step_timeout_s = opt.expert_timeout_s;
        if (ro.key.empty()) return make_error("expert worker '" + pw.name + "' is on a node: --node-key is needed");
        h.model = model_fingerprint(files);
        h.experts = pw.experts;
        h.max_expert_rows = max_rows;
        h.max_batch_tokens = opt.max_batch_tokens;
        NodeHelloReply reply;
        auto s = connect_stage_node(ro, h, &reply);
        if (!s) return make_error("expert worker '" + pw.name + "': " + s.error().message);
        sock = std::move(*s);
        spdlog::info("expert worker '{}' runs on node {} ({})", pw.name, pw.node, reply.device);
      }
      expert_devs.push_back(std::move(dev));
      expert_links.push_back(std::move(sock));
      expert_hellos.push_back(std::move(h));
      expert_opts.push_back(std::move(ro));
    }
    for (const auto& line : opt.experts->describe()) spdlog::info("expert placement: {}", line);
  }
  // A worker on a node: the router waits past its link proxy's own deadline (a frame's
  // header and body each get the timeout, plus a second), so that a node that stopped
  // answering fails the step with the proxy's text, the one the scheduler hears as the
  // node's loss and later its return (the engine then recovers).
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.expert_timeout_s * 1000));
  const auto proxy_timeout = 2 * timeout + std::chrono::milliseconds(1000);
  std::vector<ExpertRouter::Target> targets;
  for (size_t i = 0; i < expert_devs.size(); ++i) {
    const auto& pw = opt.experts->workers[i];
    const std::string name = "expert worker '" + pw.name + "'" + (pw.node.empty() ? "" : " (node " + pw.node + ")");
    expert_actor a = expert_devs[i]
                         ? sys.spawn<caf::detached>(expert_fn, expert_devs[i])
                         : spawn_remote_expert(sys, expert_links[i], name, expert_opts[i], expert_hellos[i], c.hidden);
    node.experts.push_back(a);
    targets.push_back({a, name, expert_devs[i] ? std::chrono::milliseconds(0) : proxy_timeout});
  }
  for (auto& d : devices) {
    if (!d) continue;
    if (node.moe) d->model->set_moe_stats(node.moe);
    if (ep) {
      auto router = std::make_shared<ExpertRouter>(sys, targets, opt.experts->replicas(c), timeout, node.moe);
      router->set_caller_backend(d->backend.get());
      d->dispatcher = std::move(router);
      d->model->set_expert_dispatcher(d->dispatcher.get());
    }
  }
  if (self_draft > 0) devices.front()->self_draft_layers = self_draft;
  if (opt.fail_step != 0) devices.back()->fail_step = opt.fail_step;
  if (opt.hang_step != 0) devices.back()->hang_step = opt.hang_step;
  // Remote stages: connect, authenticate and have each node build its stage (before any
  // actor is spawned, so a refusal leaves nothing behind).
  std::vector<std::shared_ptr<link::Socket>> links(devices.size());
  std::vector<NodeHello> hellos(devices.size());
  const std::string fingerprint = opt.remote_stages.empty() ? std::string() : model_fingerprint(files);
  for (const auto& [s, ro] : opt.remote_stages) {
    NodeHello h;
    h.model = fingerprint;
    h.layer_first = c.num_layers * s / opt.num_stages;
    h.layer_last = c.num_layers * (s + 1) / opt.num_stages;
    h.is_last = s == opt.num_stages - 1;
    h.kv_blocks = opt.scheduler.kv.num_blocks;
    h.block_size = opt.scheduler.kv.block_size;
    h.max_batch_tokens = opt.max_batch_tokens;
    NodeHelloReply reply;
    auto sock = connect_stage_node(ro, h, &reply);
    if (!sock) return sock.error();
    spdlog::info("stage {} (layers {}..{}) runs on node {}:{} ({})", s, h.layer_first, h.layer_last, ro.host, ro.port,
                 reply.device);
    links[static_cast<size_t>(s)] = std::move(*sock);
    hellos[static_cast<size_t>(s)] = h;
  }
  std::vector<worker_actor> stage_workers(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    if (!devices[i]) continue;
    stage_workers[i] =
        opt.detached_workers ? sys.spawn<caf::detached>(worker_fn, devices[i]) : sys.spawn(worker_fn, devices[i]);
    node.workers.push_back(stage_workers[i]);
    node.backends.push_back(devices[i]->backend->name());
  }
  node.stages.resize(devices.size());
  // JSON mode's vocabulary bytes, for the last stage's samplers (when that stage is here)
  std::shared_ptr<const TokenBytes> tokens;
  if (files.tokenizer && !links.back()) tokens = token_bytes(*files.tokenizer);
  stage_actor next;
  for (size_t i = devices.size(); i-- > 0;) {
    if (links[i]) {
      const auto& ro = opt.remote_stages.at(static_cast<int32_t>(i));
      node.stages[i] = spawn_remote_stage(
          sys, links[i], next, "stage " + std::to_string(i) + " on node " + ro.host + ":" + std::to_string(ro.port), ro,
          hellos[i], c.vocab, c.hidden);
    } else {
      node.stages[i] = sys.spawn(stage_fn, stage_workers[i], next, c.vocab,
                                 i + 1 == devices.size() ? tokens : std::shared_ptr<const TokenBytes>());
    }
    next = node.stages[i];
  }
  std::shared_ptr<const Tokenizer> tok;
  if (files.tokenizer) tok = std::make_shared<const Tokenizer>(*files.tokenizer);
  if (opt.scheduler.max_plans_in_flight <= 0) opt.scheduler.max_plans_in_flight = opt.num_stages;
  opt.scheduler.vocab_size = c.vocab;
  opt.scheduler.max_context = c.max_context;
  if (tok)
    opt.scheduler.is_eog = [tok](int32_t t) { return tok->is_eog(t); };
  else
    opt.scheduler.is_eog = [](int32_t) { return false; };
  node.board = std::make_shared<StatsBoard>();
  node.kv = sys.spawn(kv_block_fn, KvBlockActorConfig{opt.scheduler.kv, opt.check_kv_invariants});
  node.scheduler = sys.spawn(scheduler_fn, opt.scheduler, node.stages.front(), node.kv, node.board);
  for (size_t i = 0; i < links.size(); ++i)
    if (links[i])
      caf::anon_send(caf::actor_cast<caf::actor>(node.stages[i]), link_scheduler_atom::value, node.scheduler);
  for (size_t i = 0; i < expert_links.size(); ++i)
    if (expert_links[i])
      caf::anon_send(caf::actor_cast<caf::actor>(node.experts[i]), link_scheduler_atom::value, node.scheduler);
  if (tok) {
    std::vector<tokenizer_actor> toks;
    for (int32_t i = 0; i < opt.num_tokenizers; ++i) toks.push_back(sys.spawn(tokenizer_fn, tok, tmpl));
    node.tokenizers = std::make_shared<TokenizerPool>(std::move(toks));
  }
  node.request_context =
      RequestContext{node.scheduler, node.tokenizers, tok, std::make_shared<std::atomic<int64_t>>(1)};
  return node;
}

}  // namespace troupe::actors
