// The OpenAI-compatible routes of `troupe serve`: /v1/completions, /v1/chat/completions
// (JSON or server-sent events), /v1/models, /tokenize, /detokenize, /health, /metrics.
// Each generation request becomes one request actor; its updates are turned into OpenAI's
// response or chunk format here. API keys are compared in constant time; the queue cap
// answers 429 with Retry-After; a draining server answers 503.
#pragma once
#include <caf/all.hpp>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "actors/local_node.h"
#include "apps/serve/http_server.h"
#include "apps/serve/metrics.h"
#include "apps/serve/openai_request.h"

namespace troupe::serve {

struct ServerOptions {
  std::string model_name;       // the id in /v1/models; also accepted as "model"
  std::string api_key;          // "" = no authentication
  int32_t max_active_seqs = 0;  // running + queued sequences before 429 (0: no cap)
  int32_t block_size = 16;
  double stall_timeout_seconds = 120;  // /health 503 when a step has run longer (0: never)
  api::Limits limits;
};

class OpenAiServer {
 public:
  OpenAiServer(caf::actor_system& sys, ServerOptions opt);
  // The node becomes usable; until then every route but /health and /metrics answers 503.
  // `loaded` carries the fields known once the model is loaded (name, limits, caps); they
  // are read only after the node is attached.
  void attach(std::shared_ptr<actors::LocalNode> node, const ServerOptions& loaded);
  void start_drain() { draining_ = true; }
  int64_t active_requests() const { return active_requests_.load(); }
  void handle(const std::shared_ptr<Exchange>& ex);
  Metrics& metrics() { return metrics_; }
  const ServerOptions& options() const { return opt_; }
  bool speculative() const { return opt_.limits.num_speculative_tokens > 0; }

  // Accounting for one generation request (held by its stream; released on destruction).
  void release(int64_t seqs, uint64_t key) {
    active_seqs_ -= seqs;
    --active_requests_;
    std::lock_guard<std::mutex> l(live_mu_);
    pending_.erase(key);
    live_.erase(key);
  }
  uint64_t new_key() {
    std::lock_guard<std::mutex> l(live_mu_);
    pending_.insert(++next_key_);
    return next_key_;
  }
  // Records a request's actor unless the request has already been released.
  void track(uint64_t key, caf::actor_addr a) {
    std::lock_guard<std::mutex> l(live_mu_);
    if (pending_.count(key)) live_[key] = std::move(a);
  }
  // Ends every request still running (the drain deadline passed): their sequences are cancelled.
  void cancel_all() {
    std::lock_guard<std::mutex> l(live_mu_);
    for (auto& [k, a] : live_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }

 private:
  void respond(const std::shared_ptr<Exchange>& ex, int status, const std::string& body,
               std::map<std::string, std::string> extra = {});
  void error(const std::shared_ptr<Exchange>& ex, const api::ApiError& e,
             std::map<std::string, std::string> extra = {});
  bool authorized(const Exchange& ex) const;
  void health(const std::shared_ptr<Exchange>& ex);
  void models(const std::shared_ptr<Exchange>& ex);
  void tokenize(const std::shared_ptr<Exchange>& ex);
  void detokenize(const std::shared_ptr<Exchange>& ex);
  void generate(const std::shared_ptr<Exchange>& ex, bool is_chat);

  caf::actor_system& sys_;
  ServerOptions opt_;
  Metrics metrics_;
  std::shared_ptr<actors::LocalNode> node_;
  std::atomic<bool> ready_{false}, draining_{false};
  std::atomic<int64_t> active_seqs_{0}, active_requests_{0};
  int64_t created_ = 0;
  std::mutex live_mu_;
  std::map<uint64_t, caf::actor_addr> live_;
  std::set<uint64_t> pending_;
  uint64_t next_key_ = 0;
};

// Runs one generation request end to end (defined in generation.cpp).
void start_generation(caf::actor_system& sys, OpenAiServer& server, const actors::LocalNode& node,
                      std::shared_ptr<Exchange> ex, api::GenerationRequest req, int64_t num_seqs);

}  // namespace troupe::serve
