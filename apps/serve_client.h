// A real `troupe serve` as a child process and a streaming load generator for it: what
// `troupe sim calibrate` and `troupe sim validate` measure the simulator against.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "apps/common.h"
#include "sim/simulator.h"

namespace troupe::app {

// The serve flags both sides must agree on.
struct ServeSpec {
  ModelFlags model;  // model is the resolved file path
  int max_num_seqs = 64, max_num_batched_tokens = 512, kv_cache_tokens = 32768, block_size = 16, max_queue = 256;
  bool prefix_caching = true, chunked_prefill = true;
  double itl_target_ms = 100;
  std::string policy = "fcfs";
  // Expert parallelism (as troupe serve's flags; 0 / empty: off) and the step log.
  int expert_parallel = 0, expert_threads = 0;
  std::string expert_placement, node_key_file;
  std::string step_log;     // --step-log FILE
  std::string speculative;  // --speculative METHOD ("": off)
  int num_speculative_tokens = 7;
};

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { stop(); }
  // Starts `troupe serve` on a free loopback port, output to log_path, and waits until
  // /health answers 200 (error when it exits or after timeout_s).
  Status start(const ServeSpec& spec, const std::string& log_path, double timeout_s = 300);
  unsigned short port() const { return port_; }
  bool running();
  // SIGTERM (the server drains), SIGKILL after 30 s; the exit status.
  int stop();

 private:
  pid_t pid_ = -1;
  unsigned short port_ = 0;
};

// Streams one completion of `prompt` token ids (greedy, ignore_eos, max_tokens) and fills
// rec's first_token, token_times, generated and finish in seconds since t0. Returns an error
// text, or "" on success.
std::string stream_completion(unsigned short port, const std::vector<int32_t>& prompt, int32_t max_tokens,
                              std::chrono::steady_clock::time_point t0, sim::RequestRecord& rec);

struct Replay {
  std::vector<sim::RequestRecord> records;
  int failed = 0;
  std::string first_error;
};
// Sends each request at its arrival time (one thread each; prompt ids from
// sim::prompt_tokens_of, taken modulo `vocab` when that is smaller than their range) and
// waits for all. Failed requests are marked rejected.
Replay replay(unsigned short port, const std::vector<sim::SimRequest>& reqs, int32_t vocab = 0);

}  // namespace troupe::app
