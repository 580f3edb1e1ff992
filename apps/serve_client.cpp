#include "apps/serve_client.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

extern char** environ;

namespace troupe::app {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// A blocking socket's reads and writes give up after `seconds` (a hung server must not hang
// calibrate or validate).
void set_timeout(tcp::socket& s, int seconds) {
  timeval tv{seconds, 0};
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

unsigned short free_port() {
  boost::asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(boost::asio::ip::address_v4::loopback(), 0));
  return a.local_endpoint().port();
}

// GET path; the status, or -1 when nothing answers.
int http_get_status(unsigned short port, const std::string& path) {
  try {
    boost::asio::io_context io;
    tcp::socket s(io);
    s.connect({boost::asio::ip::address_v4::loopback(), port});
    set_timeout(s, 5);
    http::request<http::empty_body> req{http::verb::get, path, 11};
    req.set(http::field::host, "127.0.0.1");
    http::write(s, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    http::read(s, buf, res);
    return static_cast<int>(res.result_int());
  } catch (const std::exception&) { return -1; }
}

}  // namespace

Status ServerProcess::start(const ServeSpec& sp, const std::string& log_path, double timeout_s) {
  stop();
  port_ = free_port();
  // clang-format off
  std::vector<std::string> args = {
      "troupe", "serve", "--model", sp.model.model, "--host", "127.0.0.1", "--port", std::to_string(port_),
      "--served-model-name", "troupe-sim", "-t", std::to_string(sp.model.threads),
      "-b", std::to_string(sp.model.batch), "-c", std::to_string(sp.model.ctx), "--device", sp.model.device,
      "--load-format", sp.model.load_format, "--dtype", sp.model.dtype,
      "--max-num-seqs", std::to_string(sp.max_num_seqs),
      "--max-num-batched-tokens", std::to_string(sp.max_num_batched_tokens),
      "--kv-cache-tokens", std::to_string(sp.kv_cache_tokens), "--block-size", std::to_string(sp.block_size),
      "--scheduling-policy", sp.policy, "--max-queue", std::to_string(sp.max_queue),
      "--itl-target-ms", std::to_string(sp.itl_target_ms)};
  // clang-format on
  if (!sp.prefix_caching) args.push_back("--no-prefix-caching");
  if (!sp.chunked_prefill) args.push_back("--no-chunked-prefill");
  if (sp.expert_parallel > 0) args.insert(args.end(), {"--expert-parallel", std::to_string(sp.expert_parallel)});
  if (!sp.expert_placement.empty()) args.insert(args.end(), {"--expert-placement", sp.expert_placement});
  if (sp.expert_threads > 0) args.insert(args.end(), {"--expert-threads", std::to_string(sp.expert_threads)});
  if (!sp.node_key_file.empty()) args.insert(args.end(), {"--node-key-file", sp.node_key_file});
  if (!sp.step_log.empty()) args.insert(args.end(), {"--step-log", sp.step_log});
  if (!sp.speculative.empty())
    args.insert(args.end(), {"--speculative", sp.speculative, "--num-speculative-tokens",
                             std::to_string(sp.num_speculative_tokens)});
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  const int rc = posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    pid_ = -1;
    return make_error(std::string("cannot start troupe serve: ") + std::strerror(rc));
  }
  const auto until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (http_get_status(port_, "/health") != 200) {
    if (!running()) return make_error("troupe serve exited before it was healthy (see " + log_path + ")");
    if (Clock::now() > until) return make_error("troupe serve was not healthy in time (see " + log_path + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return {};
}

bool ServerProcess::running() {
  if (pid_ <= 0) return false;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int ServerProcess::stop() {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  int st = 0;
  for (int i = 0; i < 300; ++i) {
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &st, 0);
  pid_ = -1;
  return 137;
}

// Streams one completion; fills rec's token times (seconds from t0). Returns an error text or "".
std::string stream_completion(unsigned short port, const std::vector<int32_t>& prompt, int32_t max_tokens,
                              Clock::time_point t0, sim::RequestRecord& rec) {
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  try {
    boost::asio::io_context io;
    tcp::socket s(io);
    s.connect({boost::asio::ip::address_v4::loopback(), port});
    set_timeout(s, 600);  // a step of an overloaded 2-core server can take seconds
    // logprobs 0: every sampled token arrives as its own entry (text alone may hold back
    // an incomplete character), so each token gets its own time.
    json body = {{"model", "troupe-sim"},    {"prompt", prompt},
                 {"max_tokens", max_tokens}, {"ignore_eos", true},
                 {"temperature", 0.0},       {"logprobs", 0},
                 {"stream", true},           {"stream_options", {{"include_usage", true}}}};
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = body.dump();
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> p;
    p.body_limit(boost::none);
    http::read_header(s, buf, p);
    if (p.get().result_int() != 200) return "HTTP " + std::to_string(p.get().result_int());
    std::string pending;
    int64_t usage_tokens = -1;
    char data[8192];
    while (!p.is_done()) {
      p.get().body().data = data;
      p.get().body().size = sizeof data;
      beast::error_code ec;
      http::read_some(s, buf, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return ec.message();
      const double now = since();
      pending.append(data, sizeof data - p.get().body().size);
      for (size_t pos; (pos = pending.find("\n\n")) != std::string::npos;) {
        const std::string ev = pending.substr(0, pos);
        pending.erase(0, pos + 2);
        if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
        const json j = json::parse(ev.substr(6), nullptr, false);
        if (j.is_discarded()) return "bad SSE event";
        if (j.contains("error")) return j["error"].value("message", "error event");
        if (j.contains("usage") && j["usage"].is_object()) usage_tokens = j["usage"].value("completion_tokens", -1);
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const json& c0 = j["choices"][0];
        const auto lpit = c0.is_object() ? c0.find("logprobs") : c0.end();
        if (lpit == c0.end() || !lpit->is_object() || !lpit->contains("tokens") || !(*lpit)["tokens"].is_array())
          continue;
        const json& lp = *lpit;
        for (size_t k = 0; k < lp["tokens"].size(); ++k) {
          if (rec.first_token < 0) rec.first_token = now;
          rec.token_times.push_back(now);
          ++rec.generated;
        }
      }
    }
    rec.finish = since();
    if (usage_tokens != rec.generated)
      return "streamed " + std::to_string(rec.generated) + " deltas but usage says " + std::to_string(usage_tokens) +
             " tokens";
  } catch (const std::exception& e) { return e.what(); }
  return "";
}

Replay replay(unsigned short port, const std::vector<sim::SimRequest>& reqs, int32_t vocab) {
  Replay out;
  out.records.resize(reqs.size());
  std::mutex mu;
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::this_thread::sleep_until(
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(reqs[i].arrival_s)));
    threads.emplace_back([&, i] {
      sim::RequestRecord& r = out.records[i];
      r.id = reqs[i].id;
      r.arrival = reqs[i].arrival_s;
      r.prompt_tokens = reqs[i].prompt_tokens;
      r.output_tokens = reqs[i].output_tokens;
      r.priority = reqs[i].priority;
      std::vector<int32_t> prompt = sim::prompt_tokens_of(reqs[i]);
      if (vocab > 0)
        for (auto& t : prompt) t %= vocab;  // (a small model's vocabulary; the same prefixes stay shared)
      const std::string err = stream_completion(port, prompt, reqs[i].output_tokens, t0, r);
      if (!err.empty()) {
        std::lock_guard<std::mutex> g(mu);
        if (!out.failed++) out.first_error = err;
        r.finish = -1;
        r.rejected = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace troupe::app
