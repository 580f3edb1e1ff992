// Deferred launches of a forward step, replayed as a CUDA graph when the same launch
// sequence recurs (decode steps of the same shape). Host code, no nvcc needed.
//
// While recording, each launch is kept as a closure and its arguments (pointers, sizes,
// scalars) are folded into a 64-bit signature. flush() runs what is pending: an exact
// signature seen before is replayed from its instantiated graph; the second sighting of a
// signature is captured (stream capture of the same closures) and then replayed; anything
// else runs eagerly. Because the signature covers every argument, a replayed graph does
// exactly what the eager launches would do. Data the host passes in (token ids, RoPE
// angles, index lists) must come from pinned memory at stable addresses: the backend
// stages it in a pinned arena whose offsets are part of the signature. A sequence whose
// capture fails (a call the driver refuses in a capture, a failed instantiation) runs
// eagerly instead, then and from then on, and is counted (capture_failures()): graphs
// are a speed-up, never a reason for a step to fail.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace troupe::cuda {

class StepGraphs {
 public:
  using Launch = std::function<cudaError_t(cudaStream_t)>;
  ~StepGraphs();

  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  bool has_pending() const { return !pending_.empty(); }
  void add(const char* what, std::initializer_list<uint64_t> key, Launch launch);
  // Runs the pending launches on `stream`. On failure returns the error and sets *what to
  // the launch or CUDA call that failed.
  cudaError_t flush(cudaStream_t stream, std::string* what);
  void clear();  // forgets every graph (after buffers they refer to were freed)
  size_t num_graphs() const { return graphs_.size(); }
  uint64_t replays() const { return replays_; }
  uint64_t capture_failures() const { return capture_failures_; }

 private:
  struct Pending {
    const char* what;
    Launch launch;
  };
  static constexpr uint64_t kSeed = 1469598103934665603ull;
  static constexpr size_t kMaxGraphs = 256;
  bool recording_ = false;
  std::vector<Pending> pending_;
  uint64_t sig_ = kSeed;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  std::unordered_map<uint64_t, int> sightings_;
  std::unordered_set<uint64_t> refused_;  // signatures whose capture failed
  uint64_t replays_ = 0, capture_failures_ = 0;
  // The ops captured into an instantiated graph; null (and the error cleared) if the
  // capture or the instantiation fails.
  cudaGraphExec_t capture(std::vector<Pending>& ops, cudaStream_t stream);
};

}  // namespace troupe::cuda
