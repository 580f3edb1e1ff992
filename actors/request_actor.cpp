#include "actors/request_actor.h"

#include <random>

#include "runtime/request/context_fit.h"
#include "runtime/request/stop_matcher.h"

namespace troupe::actors {

struct ChoiceState {
  int32_t index = 0;
  int64_t seq_id = 0;
  IncrementalDecoder decoder;
  StopMatcher stops;  // holds back decoded text that could still become a stop string
  bool open = true;
  ChoiceState(const Tokenizer& t, std::vector<std::string> stop) : decoder(t, true), stops(std::move(stop)) {}
};

namespace {

using self_ptr = request_actor::stateful_pointer<RequestState>;
using clock = std::chrono::steady_clock;

double secs(clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Ends the request: every sequence still generating is cancelled at the scheduler (which
// frees its blocks). False if it had already ended.
bool close_request(self_ptr self) {
  auto& st = self->state;
  if (st.closed) return false;
  st.closed = true;
  std::vector<int64_t> open;
  for (auto& c : st.choices)
    if (c->open) open.push_back(c->seq_id);
  if (!open.empty()) self->send(st.ctx.scheduler, CancelSeqs{open});
  return true;
}

void fail(self_ptr self, int status, std::string message, std::string param = {}) {
  auto& st = self->state;
  if (!close_request(self)) return;
  RequestUpdate u;
  u.kind = RequestUpdate::Kind::failed;
  u.status = status;
  u.message = std::move(message);
  u.param = std::move(param);
  st.emit(std::move(u));
  self->quit();
}

void finish_choice(self_ptr self, ChoiceState& c, const std::string& reason) {
  auto& st = self->state;
  c.open = false;
  --st.num_open;
  RequestUpdate u;
  u.kind = RequestUpdate::Kind::finished;
  u.index = c.index;
  u.finish_reason = reason;
  st.emit(std::move(u));
  if (st.num_open > 0) return;
  RequestUpdate d;
  d.kind = RequestUpdate::Kind::done;
  for (const auto& p : st.prompts) d.prompt_total += static_cast<int64_t>(p.size()) * st.spec.n;
  d.completion_total = st.completion_tokens;
  d.drafts_accepted = st.drafts_accepted;
  d.drafts_rejected = st.drafts_rejected;
  d.ttft = st.has_first ? secs(st.first_token - st.start) : 0;
  d.e2e = secs(clock::now() - st.start);
  d.queue = st.queue;
  d.itl = std::move(st.itl);
  st.closed = true;
  st.emit(std::move(d));
  self->quit();
}

// Sends the text that can no longer become a stop string; finishes the choice on a stop string.
void push_text(self_ptr self, ChoiceState& c, const std::string& piece, std::vector<TokenOut> tokens, bool final_piece,
               const std::string& reason) {
  auto& st = self->state;
  StopMatcher::Out sent = c.stops.push(piece, final_piece);
  std::string out = std::move(sent.text);
  const bool stopped = sent.stopped;
  if (!out.empty() || !tokens.empty()) {
    RequestUpdate u;
    u.kind = RequestUpdate::Kind::delta;
    u.index = c.index;
    u.text = std::move(out);
    u.tokens = std::move(tokens);
    st.emit(std::move(u));
  }
  if (stopped) {
    self->send(st.ctx.scheduler, CancelSeqs{{c.seq_id}});
    finish_choice(self, c, "stop");
  } else if (final_piece) {
    finish_choice(self, c, reason);
  }
}

void on_event(self_ptr self, SeqEvent& ev) {
  auto& st = self->state;
  if (st.closed) return;
  const int64_t k = ev.seq_id - st.first_seq;
  if (k < 0 || k >= static_cast<int64_t>(st.choices.size())) return;
  ChoiceState& c = *st.choices[k];
  if (!c.open) return;
  if (!ev.error.empty()) {
    const bool engine = ev.error.rfind("the engine has failed", 0) == 0 || ev.error.rfind("step failed", 0) == 0;
    return fail(self, engine ? 503 : 400, ev.error, engine ? "" : "prompt");
  }
  const auto now = clock::now();
  if (!st.has_first) {
    st.has_first = true;
    st.first_token = now;
    st.queue = ev.queue_seconds;
  }
  if (c.index == 0) {
    if (st.has_last0) st.itl.push_back(secs(now - st.last_token));
    st.has_last0 = true;
    st.last_token = now;
  }
  ++st.completion_tokens;
  st.drafts_accepted += ev.drafts_accepted;
  st.drafts_rejected += ev.drafts_rejected;
  const Tokenizer& tok = *st.ctx.tokenizer;
  std::vector<TokenOut> tokens;
  if (st.spec.want_logprobs) {
    TokenOut t{ev.token, tok.token_text(ev.token), ev.logprob, {}};
    for (const auto& a : ev.top) t.top.emplace_back(tok.token_text(a.token), a.logprob);
    tokens.push_back(std::move(t));
  }
  // A stop token's text is not part of the output (as in OpenAI's API).
  std::string piece = ev.hit_stop ? std::string() : c.decoder.push(ev.token);
  if (ev.finished) piece += c.decoder.flush();
  push_text(self, c, piece, std::move(tokens), ev.finished, ev.hit_stop ? "stop" : "length");
}

// All prompts are encoded: check them, tell the client, submit one sequence per choice.
void submit_all(self_ptr self) {
  auto& st = self->state;
  const std::string what = st.spec.is_chat ? "messages" : "prompt";
  std::vector<int32_t> max_new;
  for (const auto& p : st.prompts) {
    const ContextFit f = fit_to_context(p.size(), st.spec.max_tokens, st.spec.max_context, what);
    if (!f.ok()) return fail(self, 400, f.error, f.param);
    max_new.push_back(f.max_new_tokens);
  }
  RequestUpdate started;
  started.kind = RequestUpdate::Kind::started;
  for (size_t p = 0; p < st.prompts.size(); ++p) {
    started.prompt_tokens.push_back(static_cast<int32_t>(st.prompts[p].size()));
    if (st.spec.echo)
      started.prompt_texts.push_back(st.spec.prompts[p].text ? *st.spec.prompts[p].text
                                                             : st.ctx.tokenizer->decode(st.prompts[p], false));
  }
  st.emit(std::move(started));
  const int32_t n = st.spec.n;
  const int64_t total = static_cast<int64_t>(st.prompts.size()) * n;
  st.first_seq = st.ctx.next_seq_id->fetch_add(total);
  uint64_t base_seed = st.spec.seq.sampling.seed;
  if (!st.spec.has_seed) base_seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  auto sink = caf::actor_cast<request_sink_actor>(self);
  for (int64_t k = 0; k < total; ++k) {
    auto c = std::make_shared<ChoiceState>(*st.ctx.tokenizer, st.spec.stop);
    c->index = static_cast<int32_t>(k);
    c->seq_id = st.first_seq + k;
    st.choices.push_back(c);
    ++st.num_open;
    const size_t p = static_cast<size_t>(k / n);
    SeqRequest s = st.spec.seq;
    s.id = c->seq_id;
    s.prompt = st.prompts[p];
    s.max_new_tokens = max_new[p];
    s.sampling.seed = base_seed + static_cast<uint64_t>(k % n);
    self->send(st.ctx.scheduler, std::move(s), sink);
  }
}

}  // namespace

request_actor::behavior_type request_fn(self_ptr self, RequestContext ctx, RequestSpec spec, UpdateFn emit) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.spec = std::move(spec);
  st.emit = std::move(emit);
  st.start = clock::now();
  auto on_err = [=](caf::error& e) { fail(self, 500, "tokenizer: " + self->system().render(e)); };
  if (st.spec.is_chat) {
    st.prompts.resize(1);
    self->request(st.ctx.tokenizers->pick(), caf::infinite, EncodeChat{st.spec.roles, st.spec.contents, true})
        .then(
            [=](EncodeResult& r) {
              if (!r.error.empty()) return fail(self, 400, r.error, "messages");
              self->state.prompts[0] = std::move(r.ids);
              submit_all(self);
            },
            on_err);
  } else {
    st.prompts.resize(st.spec.prompts.size());
    auto pending = std::make_shared<size_t>(0);
    for (size_t i = 0; i < st.spec.prompts.size(); ++i) {
      const PromptInput& p = st.spec.prompts[i];
      if (!p.text) {
        st.prompts[i] = p.ids;
        continue;
      }
      ++*pending;
      self->request(st.ctx.tokenizers->pick(), caf::infinite, EncodeText{*p.text, true, false})
          .then(
              [=](EncodeResult& r) {
                self->state.prompts[i] = std::move(r.ids);
                if (--*pending == 0) submit_all(self);
              },
              on_err);
    }
    if (*pending == 0) submit_all(self);
  }
  return {
      [=](SeqEvent& ev) { on_event(self, ev); },
      [=](cancel_atom) {
        if (close_request(self)) self->quit();
      },
  };
}

}  // namespace troupe::actors
