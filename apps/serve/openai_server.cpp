#include "apps/serve/openai_server.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

namespace troupe::serve {
namespace {

using json = nlohmann::json;

// Compares in time that depends only on the length of `given`, never on where they differ
// or on the secret's length.
bool constant_time_equal(const std::string& given, const std::string& secret) {
  unsigned diff = given.size() != secret.size();
  const size_t m = secret.empty() ? 1 : secret.size();
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(secret.empty() ? 0 : secret[i % m]);
  return diff == 0;
}

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

// A one-shot actor that asks a tokenizer actor and hands the answer to a callback.
template <class Msg, class Reply>
void ask_tokenizer(caf::actor_system& sys, actors::tokenizer_actor t, Msg msg, std::function<void(Reply)> cb) {
  sys.spawn([t, msg, cb](caf::event_based_actor* self) {
    self->request(t, caf::infinite, msg).then([=](Reply& r) { cb(std::move(r)); }, [=](caf::error&) { cb(Reply{}); });
  });
}

}  // namespace

OpenAiServer::OpenAiServer(caf::actor_system& sys, ServerOptions opt) : sys_(sys), opt_(std::move(opt)) {
  created_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void OpenAiServer::attach(std::shared_ptr<actors::LocalNode> node, const ServerOptions& loaded) {
  node_ = std::move(node);
  opt_.model_name = loaded.model_name;
  opt_.limits = loaded.limits;
  opt_.max_active_seqs = loaded.max_active_seqs;
  opt_.block_size = loaded.block_size;
  opt_.stall_timeout_seconds = loaded.stall_timeout_seconds;
  ready_.store(true, std::memory_order_release);
}

void OpenAiServer::respond(const std::shared_ptr<Exchange>& ex, int status, const std::string& body,
                           std::map<std::string, std::string> extra) {
  metrics_.count_http(status);
  ex->respond(status, "application/json", body, std::move(extra));
}

void OpenAiServer::error(const std::shared_ptr<Exchange>& ex, const api::ApiError& e,
                         std::map<std::string, std::string> extra) {
  respond(ex, e.status, api::error_json(e), std::move(extra));
}

bool OpenAiServer::authorized(const Exchange& ex) const {
  if (opt_.api_key.empty()) return true;
  std::string h = ex.header("Authorization");
  const std::string bearer = "Bearer ";
  if (h.size() >= bearer.size() && h.compare(0, bearer.size(), bearer) == 0) {
    h.erase(0, bearer.size());
  } else {
    h = ex.header("x-api-key");
  }
  return constant_time_equal(h, opt_.api_key);
}

void OpenAiServer::handle(const std::shared_ptr<Exchange>& ex) {
  const std::string path = path_of(ex->target());
  const std::string& m = ex->method();
  if (path == "/health") return health(ex);
  if (!authorized(*ex))
    return error(ex, {401, "invalid or missing API key", "authentication_error", "", "invalid_api_key"});
  struct Route {
    const char* path;
    const char* method;
  };
  static const Route routes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/models", "GET"},
                                 {"/tokenize", "POST"},       {"/detokenize", "POST"},          {"/metrics", "GET"}};
  const Route* route = nullptr;
  for (const auto& r : routes)
    if (path == r.path) route = &r;
  if (!route) return error(ex, {404, "no route for " + path.substr(0, 200), "not_found_error", "", ""});
  if (m != route->method)
    return error(ex,
                 {405, std::string("use ") + route->method + " for " + route->path, "invalid_request_error", "", ""});
  if (path == "/metrics") {
    std::string body = ready_ ? metrics_.render(node_->board->read(), opt_.model_name, opt_.block_size) : "";
    if (ready_ && node_->moe) body += render_moe(node_->moe->snapshot(), opt_.model_name, !node_->experts.empty());
    metrics_.count_http(200);
    return ex->respond(200, "text/plain; version=0.0.4", body);
  }
  if (!ready_.load(std::memory_order_acquire))
    return error(ex, {503, "the model is still loading", "service_unavailable", "", ""}, {{"Retry-After", "5"}});
  if (path == "/v1/models") return models(ex);
  if (path == "/tokenize") return tokenize(ex);
  if (path == "/detokenize") return detokenize(ex);
  generate(ex, path == "/v1/chat/completions");
}

void OpenAiServer::health(const std::shared_ptr<Exchange>& ex) {
  json j;
  int status = 200;
  if (!ready_.load(std::memory_order_acquire)) {
    status = 503;
    j["status"] = "loading";
  } else {
    const actors::EngineStats s = node_->board->read();
    if (draining_) {
      status = 503;
      j["status"] = "draining";
    } else if (!s.failure.empty()) {
      status = 503;
      j["status"] = "failed";
      j["error"] = s.failure;
    } else if (s.heartbeat_age_seconds > 10) {
      status = 503;
      j["status"] = "engine heartbeat lost";
    } else if (opt_.stall_timeout_seconds > 0 && s.oldest_step_seconds > opt_.stall_timeout_seconds) {
      // The scheduler beats, but a step has not come back: a hung device or worker.
      status = 503;
      j["status"] = "engine stalled";
      char msg[160];
      std::snprintf(msg, sizeof msg, "a step has run for %.1f s (--stall-timeout %g)", s.oldest_step_seconds,
                    opt_.stall_timeout_seconds);
      j["error"] = msg;
    } else {
      j["status"] = "ok";
    }
    j["heartbeat_age_seconds"] = s.heartbeat_age_seconds;
    j["oldest_step_seconds"] = s.oldest_step_seconds;
  }
  respond(ex, status, api::to_json_text(j));
}

void OpenAiServer::models(const std::shared_ptr<Exchange>& ex) {
  json m = {{"id", opt_.model_name},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "troupe"},
            {"max_model_len", opt_.limits.max_context}};
  respond(ex, 200, api::to_json_text(json{{"object", "list"}, {"data", json::array({m})}}));
}

void OpenAiServer::tokenize(const std::shared_ptr<Exchange>& ex) {
  auto parsed = api::parse_tokenize(ex->body(), opt_.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return error(ex, *e);
  auto& r = std::get<api::TokenizeRequest>(parsed);
  const int32_t max_len = opt_.limits.max_context;
  auto reply = [this, ex, max_len](actors::EncodeResult res) {
    if (!res.error.empty()) return error(ex, {400, res.error, "invalid_request_error", "messages", ""});
    respond(ex, 200,
            api::to_json_text(json{{"tokens", res.ids}, {"count", res.ids.size()}, {"max_model_len", max_len}}));
  };
  auto tok = node_->tokenizers->pick();
  if (r.prompt) {
    ask_tokenizer<actors::EncodeText, actors::EncodeResult>(sys_, tok, {*r.prompt, r.add_special_tokens, false}, reply);
  } else {
    actors::EncodeChat c;
    for (const auto& m : r.messages) {
      c.roles.push_back(m.role);
      c.contents.push_back(m.content);
    }
    c.add_generation_prompt = r.add_generation_prompt;
    ask_tokenizer<actors::EncodeChat, actors::EncodeResult>(sys_, tok, std::move(c), reply);
  }
}

void OpenAiServer::detokenize(const std::shared_ptr<Exchange>& ex) {
  auto parsed = api::parse_detokenize(ex->body(), opt_.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return error(ex, *e);
  auto ids = std::get<std::vector<int32_t>>(std::move(parsed));
  ask_tokenizer<actors::DecodeTokens, std::string>(sys_, node_->tokenizers->pick(), {std::move(ids)},
                                                   [this, ex](std::string text) {
                                                     respond(ex, 200, api::to_json_text(json{{"prompt", text}}));
                                                   });
}

void OpenAiServer::generate(const std::shared_ptr<Exchange>& ex, bool is_chat) {
  if (draining_)
    return error(ex, {503, "the server is shutting down", "service_unavailable", "", ""}, {{"Retry-After", "10"}});
  auto parsed = api::parse_generation(ex->body(), is_chat, opt_.limits);
  if (auto* e = std::get_if<api::ApiError>(&parsed)) return error(ex, *e);
  auto& req = std::get<api::GenerationRequest>(parsed);
  const int64_t seqs = static_cast<int64_t>(is_chat ? 1 : req.prompts.size()) * req.n;
  if (opt_.max_active_seqs > 0 && seqs > opt_.max_active_seqs)
    return error(ex, {400,
                      "the request asks for " + std::to_string(seqs) + " sequences; this server takes at most " +
                          std::to_string(opt_.max_active_seqs) + " at once",
                      "invalid_request_error", "n", ""});
  if (opt_.max_active_seqs > 0 && active_seqs_.fetch_add(seqs) + seqs > opt_.max_active_seqs) {
    active_seqs_ -= seqs;
    return error(ex, {429, "the server is at capacity (--max-queue); retry later", "rate_limit_error", "", ""},
                 {{"Retry-After", "1"}});
  }
  if (opt_.max_active_seqs <= 0) active_seqs_ += seqs;
  ++active_requests_;
  start_generation(sys_, *this, *node_, ex, std::move(req), seqs);
}

}  // namespace troupe::serve
