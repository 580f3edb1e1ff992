#include "actors/scheduler_actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <utility>

namespace troupe::actors {
namespace {

using self_ptr = scheduler_actor::stateful_pointer<SchedulerState>;

// Publishes the stats to the board. Not while block operations are out: the scheduler
// already counts their effect and the ledger does not yet, so running sequences and free
// blocks would disagree (a cancelled request gone, its blocks not yet back). The answer
// publishes.
void publish(SchedulerState& st) {
  if (st.kv_waiting) return;
  EngineStats& s = st.stats;
  s.num_running = static_cast<int64_t>(st.sched->num_running());
  s.num_waiting = static_cast<int64_t>(st.sched->num_waiting());
  const KvBlockStats& ks = st.ledger->stats();
  s.kv_blocks = ks.num_blocks;
  s.kv_free = ks.num_free;
  s.prefix_queries = ks.prefix_queries;
  s.prefix_hits = ks.prefix_hits;
  s.preemptions = st.sched->num_preemptions();
  s.most_plans_in_flight = st.most_in_flight;
  s.capped_steps = st.sched->num_capped_steps();
  s.spec = st.sched->spec_stats();
  if (const StepTimeModel& m = st.sched->step_time(); m.ready()) {
    s.step_fixed_seconds = m.fixed_seconds();
    s.step_token_seconds = m.seconds_per_token();
    s.step_row_seconds = m.seconds_per_row();
    s.step_pair_seconds = m.seconds_per_pair();
  }
  s.oldest_step_seconds = 0;
  if (!st.sent.empty()) {
    auto oldest = st.sent.begin()->second;
    for (const auto& [no, t] : st.sent) oldest = std::min(oldest, t);
    s.oldest_step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest).count();
  }
  if (st.board) st.board->publish(s);
}

void fail_seq(self_ptr self, const request_sink_actor& sink, int64_t id, std::string error) {
  SeqEvent ev;
  ev.seq_id = id;
  ev.finished = true;
  ev.error = std::move(error);
  self->send(sink, std::move(ev));
}

Status check_submit(const SchedulerState& st, const SeqRequest& s) {
  if (!st.stats.failure.empty()) return make_error("the engine has failed: " + st.stats.failure);
  if (st.seqs.count(s.id)) return make_error("duplicate sequence id " + std::to_string(s.id));
  return s.validate(st.cfg.vocab_size, st.cfg.max_context);
}

void fail_engine(self_ptr self, std::string error);
void on_kv_reply(self_ptr self, StepPlan& plan, const std::vector<KvOp>& ops, KvOpsReply& r);

// Sends the block operations the ledger recorded (with the plan they belong to, if any) to
// the KV-block-manager actor and awaits the answer: until it comes, this actor handles no
// other message, so no operation is recorded against a stale ledger.
void send_kv(self_ptr self, StepPlan plan) {
  auto& st = self->state;
  KvOpsRequest req = make_kv_request(*st.ledger, *st.sched, plan, ++st.kv_batch);
  req.drop_cached = std::exchange(st.drop_cached, false);
  auto ops = std::make_shared<std::vector<KvOp>>(kv_ops_for_settle(req.ops));
  auto pending = std::make_shared<StepPlan>(std::move(plan));
  const auto sent = std::chrono::steady_clock::now();
  st.kv_waiting = true;
  self->request(st.kv_actor, caf::infinite, std::move(req))
      .await(
          [=](KvOpsReply& r) {
            self->state.stats.kv_seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
            on_kv_reply(self, *pending, *ops, r);
          },
          [=](caf::error& e) {
            self->state.kv_waiting = false;
            fail_engine(self, "the KV-block manager failed: " + self->system().render(e));
          });
}

// Plans a step when fewer than max_plans_in_flight are in flight (leaving out the sequences
// the plans in flight hold) and sends its block operations; with no step to plan, still
// sends the operations pending (frees of finished or cancelled sequences). Stages take
// plans in order, so a later plan at a stage always sees the KV an earlier one wrote there.
void maybe_step(self_ptr self) {
  auto& st = self->state;
  if (st.kv_waiting) return;
  StepPlan plan;
  if (st.plans.size() < static_cast<size_t>(std::max(1, st.cfg.max_plans_in_flight)) && st.stats.failure.empty() &&
      st.sched->num_running() + st.sched->num_waiting() > 0) {
    std::set<int64_t> busy;
    for (const auto& [no, p] : st.plans)
      for (const auto& q : p.seqs) busy.insert(q.id);
    plan = st.sched->schedule(busy.empty() ? nullptr : &busy);
  }
  if (plan.seqs.empty() && !st.ledger->has_pending()) {
    // Nothing to plan now (the pipeline is full, or nothing fits): fetch the hints of
    // sequences that arrived meanwhile, so that the next plan can admit them at once.
    if (!kv_hints_missing(*st.ledger, *st.sched)) return;
  }
  send_kv(self, std::move(plan));
}

void on_kv_reply(self_ptr self, StepPlan& plan, const std::vector<KvOp>& ops, KvOpsReply& r) {
  auto& st = self->state;
  st.kv_waiting = false;
  if (auto ok = finish_kv_round(*st.ledger, *st.sched, plan, ops, r); !ok) return fail_engine(self, ok.error().message);
  if (plan.seqs.empty()) {
    maybe_step(self);
    return publish(st);
  }
  if (!r.copies.empty()) {
    // The scheduler never forks, so copy-on-write cannot arise; refuse rather than corrupt.
    return fail_engine(self, "a step plan asked for block copies, which no worker performs yet");
  }
  std::map<int64_t, const std::vector<int32_t>*> tables;
  for (const KvTable& t : r.tables)
    if (!t.blocks.empty()) tables[t.seq] = &t.blocks;
  auto ps = plan_step(plan, *st.sched, st.ledger->config().block_size, [&](int64_t id) -> const std::vector<int32_t>* {
    auto it = tables.find(id);
    return it == tables.end() ? nullptr : it->second;
  });
  if (!ps) return fail_engine(self, ps.error().message);
  StageStep step;
  step.step_no = ++st.step_no;
  step.token_ids = std::move(ps->token_ids);
  step.positions = std::move(ps->positions);
  step.query_start = std::move(ps->query_start);
  step.context_lens = std::move(ps->context_lens);
  step.slot_mapping = std::move(ps->slot_mapping);
  step.block_tables = std::move(ps->block_tables);
  step.logit_rows = std::move(ps->logit_rows);
  step.logit_seq = std::move(ps->logit_seq);
  step.max_blocks_per_seq = ps->max_blocks_per_seq;
  step.released = std::move(st.released);
  st.released.clear();
  for (int64_t id : step.logit_seq) {
    SeqInfo& info = st.seqs.at(id);
    if (!info.known_to_worker) {
      step.new_seqs.push_back(std::move(info.sampling));
      info.known_to_worker = true;
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (const auto& q : plan.seqs) {
    SeqInfo& info = st.seqs.at(q.id);
    if (info.queue_seconds < 0) info.queue_seconds = std::chrono::duration<double>(now - info.submitted).count();
    const SchedState* s = st.sched->state(q.id);
    const int32_t prompt_len = s ? static_cast<int32_t>(s->req.prompt.size()) : 0;
    st.stats.computed_prompt_tokens += std::max(0, std::min(q.num_computed + q.num_new, prompt_len) - q.num_computed);
  }
  st.plans.emplace(step.step_no, std::move(plan));
  st.sent[step.step_no] = now;
  st.most_in_flight = std::max(st.most_in_flight, st.plans.size());
  self->send(st.first_stage, std::move(step), actor_cast<step_sink_actor>(self));
  maybe_step(self);  // the next plan, while the pipeline has room
  publish(st);
}

void on_step_done(self_ptr self, StepDone& done) {
  auto& st = self->state;
  auto pit = st.plans.find(done.step_no);
  if (pit == st.plans.end()) return;  // stale (the engine failed meanwhile)
  const StepPlan plan = std::move(pit->second);
  st.plans.erase(pit);
  ++st.stats.steps;
  if (auto sit = st.sent.find(done.step_no); sit != st.sent.end()) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sit->second).count();
    st.stats.step_seconds += seconds;
    st.sched->observe_step(plan, seconds, done.draft_seconds);  // the latency target's step-time model
    if (spdlog::should_log(spdlog::level::debug)) {
      size_t rows = 0;
      for (const auto& q : plan.seqs) rows += q.samples ? 1 : 0;
      spdlog::debug("step {}: {} tokens, {} sampled rows, {:.1f} ms (compute {:.1f} ms)", done.step_no, plan.num_tokens,
                    rows, seconds * 1e3, done.compute_seconds * 1e3);
    }
    st.stats.compute_seconds += done.compute_seconds;
    if (st.cfg.on_step) st.cfg.on_step(plan, seconds, done.compute_seconds);
    st.sent.erase(sit);
  }
  std::vector<int32_t> sampled, counts;
  sampled.reserve(done.sampled.size());
  for (size_t i = 0; i < done.sampled.size(); ++i) {
    sampled.push_back(done.sampled[i].result.token);
    if (i == 0 || done.sampled[i - 1].seq_id != done.sampled[i].seq_id)
      counts.push_back(1);  // a sequence's tokens are consecutive: 1 + its accepted drafts
    else
      ++counts.back();
  }
  std::map<int64_t, size_t> drafts_fed;
  for (const auto& q : plan.seqs)
    if (!q.drafts.empty()) drafts_fed[q.id] = q.drafts.size();
  auto is_stop = [&](int64_t id, int32_t tok) {
    const SchedState* s = st.sched->state(id);
    if (!s || !st.seqs.count(id)) return false;
    if (!s->req.ignore_eos && st.cfg.is_eog && st.cfg.is_eog(tok)) return true;
    const auto& ids = s->req.stop_token_ids;
    return std::find(ids.begin(), ids.end(), tok) != ids.end();
  };
  const auto finished = st.sched->update(plan, sampled, is_stop, &counts);
  std::map<int64_t, int32_t> left;  // tokens a finishing sequence still emits this step
  for (const auto& f : finished) left[f.id] = f.step_tokens;
  for (size_t i = 0; i < done.sampled.size(); ++i) {
    auto& s = done.sampled[i];
    auto it = st.seqs.find(s.seq_id);
    if (it == st.seqs.end()) continue;  // cancelled while the step ran, or finished earlier in this step
    SeqEvent ev;
    ev.seq_id = s.seq_id;
    ev.token = s.result.token;
    ev.logprob = s.result.logprob;
    ev.top = std::move(s.result.top);
    if (auto df = drafts_fed.find(s.seq_id); df != drafts_fed.end()) {  // (the first of its tokens)
      size_t n = 1;
      while (i + n < done.sampled.size() && done.sampled[i + n].seq_id == s.seq_id) ++n;
      ev.drafts_accepted = static_cast<int32_t>(n - 1);
      ev.drafts_rejected = static_cast<int32_t>(df->second - (n - 1));
      drafts_fed.erase(df);
    }
    if (auto lf = left.find(s.seq_id); lf != left.end() && --lf->second == 0) {
      ev.finished = true;
      for (const auto& f : finished)
        if (f.id == s.seq_id) ev.hit_stop = f.hit_stop;
    }
    ++st.stats.generation_tokens;
    if (!it->second.sent_first) {
      it->second.sent_first = true;
      ev.queue_seconds = it->second.queue_seconds;
    }
    const bool is_finished = ev.finished;
    self->send(it->second.sink, std::move(ev));
    if (is_finished) {
      st.released.push_back(s.seq_id);
      st.seqs.erase(it);
    }
  }
  maybe_step(self);  // the frees of finished sequences, and the next plan
  publish(st);
}

// The engine has failed: every sequence ends with the error and its blocks return to the
// pool; new submissions are refused from now on.
void fail_engine(self_ptr self, std::string error) {
  auto& st = self->state;
  st.plans.clear();  // results of the others are ignored
  st.sent.clear();
  if (st.stats.failure.empty()) st.stats.failure = error;  // the first cause stays
  for (auto& [id, info] : st.seqs) {
    st.sched->abort(id);
    fail_seq(self, info.sink, id, "step failed: " + error);
  }
  st.seqs.clear();
  maybe_step(self);  // sends the frees
  publish(st);
}

void on_step_failed(self_ptr self, const StepFailed& f) {
  if (!self->state.plans.count(f.step_no)) return;
  fail_engine(self, f.error);
}

}  // namespace

scheduler_actor::behavior_type scheduler_fn(self_ptr self, SchedulerActorConfig cfg, stage_actor first_stage,
                                            kv_block_actor kv_actor, std::shared_ptr<StatsBoard> board) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.ledger = std::make_unique<KvLedger>(st.cfg.kv, st.cfg.scheduler.chunked_prefill);
  st.sched = std::make_unique<Scheduler>(st.cfg.scheduler, *st.ledger, st.cfg.policy);
  st.sched->set_draft_source(st.cfg.draft.get());
  st.first_stage = std::move(first_stage);
  st.kv_actor = std::move(kv_actor);
  st.board = std::move(board);
  publish(st);
  if (st.cfg.heartbeat.count() > 0) self->send(self, heartbeat_atom::value);
  return {
      [=](SeqRequest& s, request_sink_actor sink) {
        auto& st = self->state;
        const int64_t id = s.id;
        if (auto ok = check_submit(st, s); !ok) return fail_seq(self, sink, id, ok.error().message);
        SeqInfo info;
        info.sink = sink;
        info.submitted = std::chrono::steady_clock::now();
        info.sampling = NewSeqSampling{id, s.sampling, s.prompt};  // (a message to the last stage)
        const size_t prompt_tokens = s.prompt.size();
        if (auto ok = st.sched->add(std::move(s)); !ok) return fail_seq(self, sink, id, ok.error().message);
        st.stats.prompt_tokens += prompt_tokens;
        st.seqs.emplace(id, std::move(info));
        maybe_step(self);
        publish(st);
      },
      [=](CancelSeqs& c) {
        auto& st = self->state;
        for (int64_t id : c.seq_ids) {
          auto it = st.seqs.find(id);
          if (it == st.seqs.end()) continue;
          st.sched->abort(id);  // its Free goes to the KV-block manager below; an in-flight step's token is dropped
          if (it->second.known_to_worker) st.released.push_back(id);
          st.seqs.erase(it);
        }
        maybe_step(self);  // the frees go to the KV-block manager now, with or without a step
        publish(st);
      },
      [=](StepDone& d) { on_step_done(self, d); },
      [=](StepFailed& f) { on_step_failed(self, f); },
      [=](StatsQuery) -> EngineStats {
        publish(self->state);
        return self->state.stats;
      },
      [=](stage_down_atom, std::string& cause) {
        if (self->state.stats.failure.empty()) fail_engine(self, std::move(cause));
      },
      [=](stage_rejoined_atom, const std::string& cause) {
        auto& st = self->state;
        // (the cause is the lost node's text, or the name every failure it caused begins with)
        if (st.stats.failure.empty() || st.stats.failure.rfind(cause, 0) != 0) return;  // failed for another reason
        spdlog::info("engine recovered: the stage that failed it is back; cached prefixes dropped");
        st.stats.failure.clear();
        st.drop_cached = true;
        publish(st);
      },
      [=](heartbeat_atom) {
        publish(self->state);
        self->delayed_send(self, self->state.cfg.heartbeat, heartbeat_atom::value);
      },
  };
}

}  // namespace troupe::actors
