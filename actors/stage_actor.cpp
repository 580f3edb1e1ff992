#include "actors/stage_actor.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "runtime/sample/speculative.h"

namespace troupe::actors {
namespace {

// Last stage, as a step arrives: sampler state for its new sequences, and each logit row's
// settings for sampling on the worker's device (rows whose sampler allows it). A sequence
// has a logit row in at most one step in flight (its next token needs this one), so the
// draw counters read here are current.
void prepare_sampling(StageState& st, StageStep& s) {
  for (auto& ns : s.new_seqs) {
    Sampler smp(ns.sampling, st.vocab);
    smp.add_prompt(ns.prompt);
    smp.set_token_bytes(st.token_bytes);
    if (!ns.sampling.grammar.empty() && st.grammars) {
      // The server compiled the same text before admitting the request; a failure here
      // means another build sent it, and the sequence is then held to ending at once.
      auto table = st.grammars->get(ns.sampling.grammar);
      if (!table) {
        spdlog::error("stage: sequence {}: its grammar does not compile here: {}", ns.seq_id, table.error().message);
        table = st.grammars->get("root ::= \"\"");
      }
      if (table) smp.set_grammar(*table);
    }
    if (st.samplers.count(ns.seq_id))  // a reused id: the old one's release is still on its way
      st.pending.insert_or_assign(ns.seq_id, std::make_pair(s.step_no, std::move(smp)));
    else
      st.samplers.insert_or_assign(ns.seq_id, std::move(smp));
  }
  s.new_seqs.clear();
  s.sampling.clear();
  for (size_t i = 0; i < s.logit_seq.size(); ++i) {
    const int64_t id = s.logit_seq[i];
    // A sequence verifying drafts has several rows, drawn in turn on the host (each draw
    // depends on the token before it being accepted).
    if (verifies_drafts(s.logit_seq, i)) {
      s.sampling.push_back(DeviceSampleParams{});
      continue;
    }
    const Sampler* smp = nullptr;
    if (auto pit = st.pending.find(id); pit != st.pending.end())
      smp = &pit->second.second;
    else if (auto it = st.samplers.find(id); it != st.samplers.end())
      smp = &it->second;
    s.sampling.push_back(smp ? smp->device_params() : DeviceSampleParams{});
  }
}

// Last stage, as the worker answers: each logit row through its sequence's own sampler, or
// the token the device drew for it (the sampler counts that draw). A sequence with several
// rows verifies the drafts fed after its first (verify_drafts): its tokens are the accepted
// drafts and the target's next one, consecutive in the answer.
Result<StepDone> sample_rows(StageState& st, const LayersDone& d) {
  const StageStep& s = d.step;
  for (int64_t id : s.released) st.samplers.erase(id);
  for (auto it = st.pending.begin(); it != st.pending.end();) {  // reused ids, now released
    if (it->second.first <= s.step_no) {
      st.samplers.insert_or_assign(it->first, std::move(it->second.second));
      it = st.pending.erase(it);
    } else {
      ++it;
    }
  }
  const size_t rows = s.logit_rows.size();
  if (!d.device_tokens.empty() && (d.device_tokens.size() != rows || d.device_logprobs.size() != rows))
    return make_error("worker returned device samples of the wrong size");
  auto on_device = [&](size_t i) { return !d.device_tokens.empty() && d.device_tokens[i] >= 0; };
  bool any_host = false;
  for (size_t i = 0; i < rows; ++i) any_host = any_host || !on_device(i);
  if (any_host && d.logits.size() != rows * static_cast<size_t>(st.vocab))
    return make_error("worker returned logits of the wrong size");
  for (int64_t id : s.logit_seq)
    if (!st.samplers.count(id))
      return make_error("step samples sequence " + std::to_string(id) + " with no sampler state");
  StepDone done;
  done.step_no = s.step_no;
  for (size_t i = 0; i < rows; ++i) {
    const int64_t id = s.logit_seq[i];
    Sampler& smp = st.samplers.at(id);
    const size_t n = sequence_rows(s.logit_seq, i);
    if (n > 1) {
      auto drafts = drafts_after_rows(s.logit_rows, s.token_ids, i, n);
      if (!drafts) return make_error("sequence " + std::to_string(id) + ": " + drafts.error().message);
      for (auto& r : verify_drafts(smp, *drafts, [&](size_t j) { return d.logits.data() + (i + j) * st.vocab; }))
        done.sampled.push_back({id, std::move(r)});
      i += n - 1;
      continue;
    }
    SampleResult r;
    if (on_device(i)) {
      auto drawn = smp.device_draw(d.device_tokens[i], d.device_logprobs[i]);
      if (!drawn) return make_error("worker: " + drawn.error().message);
      r = std::move(*drawn);
    } else {
      r = smp.sample(d.logits.data() + i * static_cast<size_t>(st.vocab));
    }
    smp.accept(r.token);
    done.sampled.push_back({s.logit_seq[i], std::move(r)});
  }
  return done;
}

}  // namespace

stage_actor::behavior_type stage_fn(stage_actor::stateful_pointer<StageState> self, worker_actor worker,
                                    stage_actor next, int32_t vocab, std::shared_ptr<const TokenBytes> token_bytes) {
  self->state.worker = std::move(worker);
  self->state.token_bytes = std::move(token_bytes);
  if (self->state.token_bytes) self->state.grammars = std::make_unique<GrammarCache>(self->state.token_bytes);
  self->state.is_last = !next;
  self->state.next = std::move(next);
  self->state.vocab = vocab;
  return {
      [=](StageStep& s, step_sink_actor sink) {
        const uint64_t step_no = s.step_no;
        if (self->state.is_last) prepare_sampling(self->state, s);
        self->request(self->state.worker, caf::infinite, std::move(s))
            .then(
                [=](LayersDone& d) {
                  auto& st = self->state;
                  if (!d.error.empty()) {
                    self->send(sink, StepFailed{step_no, std::move(d.error)});
                    return;
                  }
                  if (!st.is_last) {
                    d.step.compute_seconds += d.compute_seconds;
                    self->send(st.next, std::move(d.step), sink);
                    return;
                  }
                  const auto t0 = std::chrono::steady_clock::now();
                  auto done = sample_rows(st, d);
                  if (!done) {
                    self->send(sink, StepFailed{step_no, done.error().message});
                    return;
                  }
                  done->draft_seconds = d.draft_seconds;
                  done->compute_seconds = d.step.compute_seconds + d.compute_seconds +
                                          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                  self->send(sink, std::move(*done));
                },
                [=](caf::error& e) {
                  self->send(sink, StepFailed{step_no, "worker failed: " + self->system().render(e)});
                });
      },
  };
}

}  // namespace troupe::actors
