// Prometheus metrics of the service node, named after vLLM's with a `troupe:` prefix.
// Request-level histograms are observed by the HTTP layer when a request ends; engine
// gauges and counters come from the scheduler actor's published stats.
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "runtime/model/moe.h"

namespace troupe::serve {

// The mixture-of-experts series (troupe:moe_*): tokens routed per layer and expert, the
// routing imbalance, and with expert parallelism the dispatch/combine costs.
std::string render_moe(const MoeStats::Snapshot& m, const std::string& model_name, bool expert_parallel);

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Prometheus text lines for `name` (buckets, sum, count), with a HELP line.
  std::string render(const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void observe_request(double ttft, double e2e, double queue, const std::vector<double>& itl,
                       const std::string& finish_reason, int64_t prompt_tokens, int64_t completion_tokens);
  void count_http(int status);
  std::string render(const actors::EngineStats& s, const std::string& model_name, int32_t block_size) const;

 private:
  Histogram ttft_, itl_, e2e_, queue_, prompt_len_, gen_len_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> finished_;  // by finish reason
  std::map<int, uint64_t> http_;              // responses by status
};

}  // namespace troupe::serve
