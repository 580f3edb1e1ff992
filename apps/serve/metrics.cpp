#include "apps/serve/metrics.h"

#include <cmath>
#include <cstdio>

namespace troupe::serve {
namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string with(const std::string& labels, const std::string& extra) {
  if (labels.empty()) return "{" + extra + "}";
  return "{" + labels + "," + extra + "}";
}

std::string braces(const std::string& labels) { return labels.empty() ? "" : "{" + labels + "}"; }

}  // namespace

std::string render_moe(const MoeStats::Snapshot& m, const std::string& model_name, bool ep) {
  const std::string lbl = "model_name=\"" + model_name + "\"";
  std::string out =
      "# HELP troupe:moe_expert_tokens_total Tokens routed to each expert, by layer.\n"
      "# TYPE troupe:moe_expert_tokens_total counter\n";
  for (int32_t l = 0; l < m.num_layers; ++l)
    for (int32_t e = 0; e < m.num_experts; ++e)
      out += "troupe:moe_expert_tokens_total{" + lbl + ",layer=\"" + std::to_string(l) + "\",expert=\"" +
             std::to_string(e) + "\"} " + std::to_string(m.tokens[static_cast<size_t>(l) * m.num_experts + e]) + "\n";
  auto one = [&](const std::string& name, const char* type, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + "{" + lbl + "} " + num(v) +
           "\n";
  };
  one("troupe:moe_layer_steps_total", "counter", "MoE layer evaluations (one per MoE layer per step).",
      static_cast<double>(m.layer_steps));
  one("troupe:moe_imbalance_ratio", "gauge",
      "Routing imbalance: the most tokens on one expert over the mean, averaged over layer-steps (1 = even).",
      m.layer_steps ? m.imbalance_sum / static_cast<double>(m.layer_steps) : 0.0);
  one("troupe:moe_imbalance_ratio_max", "gauge", "The largest routing imbalance of one layer-step so far.",
      m.imbalance_max);
  if (!ep) return out;
  one("troupe:moe_dispatches_total", "counter", "Expert-parallel dispatches (one per MoE layer per step).",
      static_cast<double>(m.dispatches));
  one("troupe:moe_dispatch_seconds_total", "counter",
      "Wall time from sending a layer's rows to the expert workers to having every answer (their compute included).",
      m.dispatch_seconds);
  one("troupe:moe_expert_compute_seconds_total", "counter", "The expert workers' compute time, summed over workers.",
      m.worker_compute_seconds);
  one("troupe:moe_combine_seconds_total", "counter", "The stage's weighted combine of the experts' answers.",
      m.combine_seconds);
  one("troupe:moe_dispatch_bytes_total", "counter", "Payload bytes sent to expert workers (rows, ids, counts).",
      static_cast<double>(m.dispatch_bytes));
  one("troupe:moe_combine_bytes_total", "counter", "Payload bytes of the expert workers' answers.",
      static_cast<double>(m.combine_bytes));
  one("troupe:moe_worker_imbalance_ratio", "gauge",
      "Expert-worker load: the most rows on one worker over the mean, averaged over dispatches (1 = even).",
      m.dispatches ? m.worker_ratio_sum / static_cast<double>(m.dispatches) : 0.0);
  return out;
}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> l(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help, const std::string& labels) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const double le = i < bounds_.size() ? bounds_[i] : INFINITY;
    out += name + "_bucket" + with(labels, "le=\"" + num(le) + "\"") + " " + std::to_string(cum) + "\n";
  }
  out += name + "_sum" + braces(labels) + " " + num(sum_) + "\n";
  out += name + "_count" + braces(labels) + " " + std::to_string(count_) + "\n";
  return out;
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
             80.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0}),
      queue_({0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0}),
      prompt_len_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      gen_len_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}) {}

void Metrics::observe_request(double ttft, double e2e, double queue, const std::vector<double>& itl,
                              const std::string& finish_reason, int64_t prompt_tokens, int64_t completion_tokens) {
  ttft_.observe(ttft);
  e2e_.observe(e2e);
  queue_.observe(queue);
  for (double v : itl) itl_.observe(v);
  prompt_len_.observe(static_cast<double>(prompt_tokens));
  gen_len_.observe(static_cast<double>(completion_tokens));
  std::lock_guard<std::mutex> l(mu_);
  ++finished_[finish_reason];
}

void Metrics::count_http(int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++http_[status];
}

std::string Metrics::render(const actors::EngineStats& s, const std::string& model_name, int32_t block_size) const {
  const std::string lbl = "model_name=\"" + model_name + "\"";
  std::string out;
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + "{" + lbl + "} " + num(v) + "\n";
  };
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + "{" + lbl + "} " + num(v) + "\n";
  };
  gauge("troupe:num_requests_running", "Sequences in the running batch.", static_cast<double>(s.num_running));
  gauge("troupe:num_requests_waiting", "Sequences waiting to be scheduled.", static_cast<double>(s.num_waiting));
  gauge("troupe:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
        s.kv_blocks ? 1.0 - static_cast<double>(s.kv_free) / s.kv_blocks : 0.0);
  gauge("troupe:kv_cache_free_blocks", "KV-cache blocks free (cached or empty).", s.kv_free);
  gauge("troupe:engine_heartbeat_age_seconds", "Seconds since the scheduler actor's last heartbeat.",
        s.heartbeat_age_seconds);
  gauge("troupe:engine_oldest_step_seconds", "Seconds the oldest engine step in flight has run (0: none).",
        s.oldest_step_seconds);
  counter("troupe:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (full blocks).",
          static_cast<double>(s.prefix_queries) * block_size);
  counter("troupe:prefix_cache_hits_total", "Prompt tokens found in the prefix cache (full blocks).",
          static_cast<double>(s.prefix_hits) * block_size);
  counter("troupe:prompt_tokens_total", "Prompt tokens admitted.", static_cast<double>(s.prompt_tokens));
  counter("troupe:prompt_tokens_computed_total", "Prompt tokens computed (not served by the prefix cache).",
          static_cast<double>(s.computed_prompt_tokens));
  counter("troupe:generation_tokens_total", "Tokens generated.", static_cast<double>(s.generation_tokens));
  counter("troupe:num_preemptions_total", "Sequences preempted (recomputed later) for KV space.",
          static_cast<double>(s.preemptions));
  counter("troupe:engine_steps_total", "Forward steps run.", static_cast<double>(s.steps));
  counter("troupe:itl_target_capped_steps_total",
          "Steps whose token budget the inter-token latency target (--itl-target-ms) lowered.",
          static_cast<double>(s.capped_steps));
  gauge("troupe:step_time_fixed_seconds", "Learned step time: the fixed part (0 until learned).", s.step_fixed_seconds);
  gauge("troupe:step_time_per_token_seconds", "Learned step time: seconds per token in the step (0 until learned).",
        s.step_token_seconds);
  gauge("troupe:step_time_per_row_seconds", "Learned step time: seconds per sampled row (0 until learned).",
        s.step_row_seconds);
  gauge("troupe:step_time_per_pair_seconds",
        "Learned step time: seconds per attention (query, key) pair (0 until learned).", s.step_pair_seconds);
  counter("troupe:engine_step_seconds_total", "Wall time of finished steps, from sending the plan to its result.",
          s.step_seconds);
  counter("troupe:engine_compute_seconds_total",
          "Time in the stages' layers and the sampling, summed over stages (one stage, one plan in flight: step minus "
          "compute is the actor hops).",
          s.compute_seconds);
  counter("troupe:engine_kv_seconds_total",
          "Time in KV-block-manager round trips (a step's block operations sent, applied and answered), summed.",
          s.kv_seconds);
  counter("troupe:spec_decode_num_drafts_total", "Sequence steps that fed speculative drafts (--speculative).",
          static_cast<double>(s.spec.num_drafts));
  counter("troupe:spec_decode_num_draft_tokens_total", "Speculative draft tokens fed to the target.",
          static_cast<double>(s.spec.num_draft_tokens));
  counter("troupe:spec_decode_num_accepted_tokens_total", "Speculative draft tokens the target accepted.",
          static_cast<double>(s.spec.num_accepted_tokens));
  out +=
      "# HELP troupe:spec_decode_num_accepted_tokens_per_pos Accepted draft tokens by position in the draft (0: "
      "first).\n# TYPE troupe:spec_decode_num_accepted_tokens_per_pos counter\n";
  for (size_t i = 0; i < s.spec.accepted_per_pos.size(); ++i)
    out += "troupe:spec_decode_num_accepted_tokens_per_pos{" + lbl + ",position=\"" + std::to_string(i) + "\"} " +
           num(static_cast<double>(s.spec.accepted_per_pos[i])) + "\n";
  gauge("troupe:step_plans_in_flight_max", "Most step plans in flight at once so far (up to one per pipeline stage).",
        static_cast<double>(s.most_plans_in_flight));
  {
    std::lock_guard<std::mutex> l(mu_);
    out +=
        "# HELP troupe:request_success_total Finished requests by finish reason.\n# TYPE troupe:request_success_total "
        "counter\n";
    for (const auto& [r, n] : finished_)
      out += "troupe:request_success_total{" + lbl + ",finished_reason=\"" + r + "\"} " + std::to_string(n) + "\n";
    out += "# HELP troupe:http_responses_total HTTP responses by status.\n# TYPE troupe:http_responses_total counter\n";
    for (const auto& [code, n] : http_)
      out += "troupe:http_responses_total{" + lbl + ",status=\"" + std::to_string(code) + "\"} " + std::to_string(n) +
             "\n";
  }
  out += ttft_.render("troupe:time_to_first_token_seconds", "Time to first token.", lbl);
  out += itl_.render("troupe:inter_token_latency_seconds", "Time between consecutive output tokens.", lbl);
  out += e2e_.render("troupe:e2e_request_latency_seconds", "End-to-end request latency.", lbl);
  out += queue_.render("troupe:request_queue_time_seconds", "Time from submission to first scheduled step.", lbl);
  out += prompt_len_.render("troupe:request_prompt_tokens", "Prompt tokens per request.", lbl);
  out += gen_len_.render("troupe:request_generation_tokens", "Generated tokens per request.", lbl);
  return out;
}

}  // namespace troupe::serve
