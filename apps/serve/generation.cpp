// One generation request over HTTP: the request actor's updates become OpenAI's response
// (one JSON at the end) or its server-sent-event chunks, for completions and chat.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/serve/openai_server.h"

namespace troupe::serve {
namespace {

using json = nlohmann::json;
using actors::RequestUpdate;

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

struct Choice {
  std::string text;
  std::vector<actors::TokenOut> tokens;
  std::string finish_reason;
  size_t shown = 0;  // streaming with tools: bytes of text sent as content so far
};

// OpenAI's tool_calls array (index only in stream deltas).
json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(OpenAiServer& server, std::shared_ptr<Exchange> ex, api::GenerationRequest req, int64_t seqs)
      : server_(server), ex_(std::move(ex)), req_(std::move(req)), seqs_(seqs) {
    id_ = random_id(req_.is_chat ? "chatcmpl-" : "cmpl-");
    created_ =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    model_ = req_.model.empty() ? server_.options().model_name : req_.model;
  }
  ~Generation() { release_once(); }
  // The request's place in the queue cap is given back as soon as its answer is complete or
  // its client has gone, before the actor winds down, so a client's next request fits.
  void release_once() {
    if (!released_.exchange(true)) server_.release(seqs_, key_);
  }
  uint64_t key_ = 0;

  const std::string& id() const { return id_; }

  // Called on the request actor's thread, one update at a time.
  void on_update(RequestUpdate u) {
    switch (u.kind) {
      case RequestUpdate::Kind::started:
        return on_started(u);
      case RequestUpdate::Kind::delta:
        return on_delta(u);
      case RequestUpdate::Kind::finished:
        return on_finished(u);
      case RequestUpdate::Kind::failed:
        return on_failed(u);
      case RequestUpdate::Kind::done:
        return on_done(u);
    }
  }

 private:
  json chunk_base() const {
    return json{{"id", id_},
                {"object", req_.is_chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", model_}};
  }
  void send_event(const json& j) { ex_->send_chunk("data: " + api::to_json_text(j) + "\n\n"); }
  size_t num_choices() const { return choices_.size(); }

  void on_started(const RequestUpdate& u) {
    prompt_tokens_ = u.prompt_tokens;
    prompt_texts_ = u.prompt_texts;
    const size_t n = prompt_tokens_.size() * static_cast<size_t>(req_.n);
    choices_.resize(n);
    if (req_.echo)
      for (size_t k = 0; k < n; ++k) choices_[k].text = prompt_texts_[k / req_.n];
    if (!req_.stream) return;
    ex_->start_stream("text/event-stream");
    streaming_ = true;
    for (size_t k = 0; k < n; ++k) {
      json c = chunk_base();
      if (req_.is_chat)
        c["choices"] = json::array({{{"index", k},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
      else if (req_.echo)
        c["choices"] = json::array(
            {{{"index", k}, {"text", choices_[k].text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
      else
        continue;
      send_event(c);
    }
  }

  json logprobs_json(const std::vector<actors::TokenOut>& toks, size_t text_offset) const {
    if (!req_.logprobs) return nullptr;
    if (req_.is_chat) {
      json content = json::array();
      for (const auto& t : toks) {
        json top = json::array();
        for (const auto& [s, lp] : t.top) top.push_back({{"token", s}, {"logprob", lp}, {"bytes", bytes_of(s)}});
        content.push_back(
            {{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_of(t.text)}, {"top_logprobs", top}});
      }
      return json{{"content", content}};
    }
    json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    for (const auto& t : toks) {
      tokens.push_back(t.text);
      lps.push_back(t.logprob);
      json top = json::object();
      for (const auto& [s, lp] : t.top) top[s] = lp;
      tops.push_back(req_.top_logprobs > 0 ? top : json(nullptr));
      offs.push_back(text_offset);
      text_offset += t.text.size();
    }
    return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }

  // The answer's tool calls (runtime/chat/tool_calls.h), each with a fresh id.
  ParsedToolCalls tool_calls_of(const std::string& text) const {
    ParsedToolCalls p = parse_tool_calls(text, req_.tools);
    for (auto& c : p.calls) c.id = random_id("call_");
    return p;
  }

  // Streaming with tools: content is sent only up to where a call might begin; the rest
  // waits for the end of the answer (on_finished), which sends it or the calls.
  void on_tool_delta(Choice& c, int32_t index) {
    const bool forced = req_.tool_choice.kind != ToolChoice::Kind::Auto;
    const size_t safe = forced ? 0 : tool_content_prefix(c.text);
    if (safe <= c.shown) return;
    json ch = chunk_base();
    ch["choices"] = json::array({{{"index", index},
                                  {"delta", {{"content", c.text.substr(c.shown, safe - c.shown)}}},
                                  {"logprobs", nullptr},
                                  {"finish_reason", nullptr}}});
    send_event(ch);
    c.shown = safe;
  }

  void on_delta(RequestUpdate& u) {
    if (u.index < 0 || static_cast<size_t>(u.index) >= choices_.size()) return;
    Choice& c = choices_[u.index];
    if (streaming_ && req_.tools_active()) {
      c.text += u.text;
      for (auto& t : u.tokens) c.tokens.push_back(std::move(t));
      return on_tool_delta(c, u.index);
    }
    const size_t offset = c.text.size();
    if (streaming_) {
      json ch = chunk_base();
      json choice = {{"index", u.index}, {"logprobs", logprobs_json(u.tokens, offset)}, {"finish_reason", nullptr}};
      if (req_.is_chat)
        choice["delta"] = {{"content", u.text}};
      else
        choice["text"] = u.text;
      ch["choices"] = json::array({choice});
      send_event(ch);
    }
    c.text += u.text;
    for (auto& t : u.tokens) c.tokens.push_back(std::move(t));
  }

  void on_finished(const RequestUpdate& u) {
    if (u.index < 0 || static_cast<size_t>(u.index) >= choices_.size()) return;
    Choice& fc = choices_[u.index];
    fc.finish_reason = u.finish_reason;
    if (!streaming_) return;
    if (req_.tools_active()) {  // the held tail: the calls, or content after all
      ParsedToolCalls p = tool_calls_of(fc.text);
      json delta;
      if (!p.calls.empty()) {
        delta = {{"tool_calls", tool_calls_json(p.calls, true)}};
        fc.finish_reason = "tool_calls";
      } else if (fc.shown < fc.text.size()) {
        delta = {{"content", fc.text.substr(fc.shown)}};
      }
      fc.shown = fc.text.size();
      if (!delta.is_null()) {
        json ch = chunk_base();
        ch["choices"] =
            json::array({{{"index", u.index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
        send_event(ch);
      }
    }
    json ch = chunk_base();
    json choice = {{"index", u.index}, {"logprobs", nullptr}, {"finish_reason", fc.finish_reason}};
    if (req_.is_chat)
      choice["delta"] = json::object();
    else
      choice["text"] = "";
    ch["choices"] = json::array({choice});
    send_event(ch);
  }

  void on_failed(const RequestUpdate& u) {
    release_once();
    api::ApiError e{u.status, u.message, u.status >= 500 ? "server_error" : "invalid_request_error", u.param, ""};
    spdlog::warn("request {} failed ({}): {}", id_, u.status, u.message);
    server_.metrics().count_http(u.status);
    if (!streaming_) return ex_->respond(u.status, "application/json", api::error_json(e));
    ex_->send_chunk("data: " + api::error_json(e) + "\n\n");
    ex_->send_chunk("data: [DONE]\n\n");
    ex_->end_stream();
  }

  // With speculation on the server, completion_tokens_details says how many of the tokens
  // were accepted drafts and how many drafts were rejected (OpenAI's predicted-output fields).
  json usage(const RequestUpdate& u) const {
    int64_t prompt = 0;
    for (int32_t p : prompt_tokens_) prompt += p;
    json j{{"prompt_tokens", prompt},
           {"completion_tokens", u.completion_total},
           {"total_tokens", prompt + u.completion_total}};
    if (server_.speculative())
      j["completion_tokens_details"] = {{"accepted_prediction_tokens", u.drafts_accepted},
                                        {"rejected_prediction_tokens", u.drafts_rejected}};
    return j;
  }

  void on_done(const RequestUpdate& u) {
    release_once();
    std::string finish = choices_.empty() ? "length" : choices_[0].finish_reason;
    server_.metrics().observe_request(u.ttft, u.e2e, u.queue, u.itl, finish, u.prompt_total, u.completion_total);
    server_.metrics().count_http(200);
    spdlog::info("{} done: prompt {} tok, output {} tok, ttft {:.3f} s, total {:.3f} s, finish {}", id_, u.prompt_total,
                 u.completion_total, u.ttft, u.e2e, finish);
    if (streaming_) {
      if (req_.include_usage) {
        json ch = chunk_base();
        ch["choices"] = json::array();
        ch["usage"] = usage(u);
        send_event(ch);
      }
      ex_->send_chunk("data: [DONE]\n\n");
      ex_->end_stream();
      return;
    }
    json out = json::array();
    for (size_t k = 0; k < choices_.size(); ++k) {
      const Choice& c = choices_[k];
      const size_t echo_len = req_.echo ? prompt_texts_[k / req_.n].size() : 0;
      json choice = {{"index", k}, {"logprobs", logprobs_json(c.tokens, echo_len)}, {"finish_reason", c.finish_reason}};
      ParsedToolCalls calls;
      if (req_.tools_active()) calls = tool_calls_of(c.text);
      if (!calls.calls.empty()) {
        choice["message"] = {{"role", "assistant"},
                             {"content", calls.content.empty() ? json(nullptr) : json(calls.content)},
                             {"tool_calls", tool_calls_json(calls.calls, false)}};
        choice["finish_reason"] = "tool_calls";
      } else if (req_.is_chat)
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      else
        choice["text"] = c.text;
      out.push_back(std::move(choice));
    }
    json r = {{"id", id_},           {"object", req_.is_chat ? "chat.completion" : "text_completion"},
              {"created", created_}, {"model", model_},
              {"choices", out},      {"usage", usage(u)}};
    ex_->respond(200, "application/json", api::to_json_text(r));
  }

  OpenAiServer& server_;
  std::shared_ptr<Exchange> ex_;
  api::GenerationRequest req_;
  int64_t seqs_;
  std::string id_, model_;
  int64_t created_ = 0;
  bool streaming_ = false;
  std::atomic<bool> released_{false};
  std::vector<int32_t> prompt_tokens_;
  std::vector<std::string> prompt_texts_;
  std::vector<Choice> choices_;
};

}  // namespace

void start_generation(caf::actor_system& sys, OpenAiServer& server, const actors::LocalNode& node,
                      std::shared_ptr<Exchange> ex, api::GenerationRequest req, int64_t num_seqs) {
  actors::RequestSpec spec;
  spec.is_chat = req.is_chat;
  for (const auto& p : req.prompts) spec.prompts.push_back({p.text, p.token_ids});
  for (const auto& m : req.messages) {
    spec.roles.push_back(m.role);
    spec.contents.push_back(m.content);
  }
  spec.max_tokens = req.max_tokens;
  spec.n = req.n;
  spec.seq = req.seq;
  spec.has_seed = req.has_seed;
  spec.stop = req.stop;
  spec.echo = req.echo && !req.is_chat;
  spec.want_logprobs = req.logprobs;
  spec.max_context = server.options().limits.max_context;
  auto gen = std::make_shared<Generation>(server, ex, std::move(req), num_seqs);
  spec.request_id = gen->id();
  gen->key_ = server.new_key();
  auto actor = sys.spawn(actors::request_fn, node.request_context, std::move(spec),
                         [gen](RequestUpdate u) { gen->on_update(std::move(u)); });
  server.track(gen->key_, actor.address());
  // A client that goes away cancels the request (its KV blocks are freed at once).
  ex->on_disconnect([actor, weak = std::weak_ptr<Generation>(gen)] {
    caf::anon_send(actor, actors::cancel_atom::value);
    if (auto g = weak.lock()) g->release_once();
  });
}

}  // namespace troupe::serve
