#include "kernels/cuda/step_graph.h"

namespace troupe::cuda {
namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xFF;
    h *= 1099511628211ull;
  }
  return h;
}
}  // namespace

StepGraphs::~StepGraphs() { clear(); }

void StepGraphs::clear() {
  for (auto& [sig, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  sightings_.clear();
}

void StepGraphs::add(const char* what, std::initializer_list<uint64_t> key, Launch launch) {
  sig_ = mix(sig_, reinterpret_cast<uintptr_t>(what));
  for (uint64_t k : key) sig_ = mix(sig_, k);
  pending_.push_back({what, std::move(launch)});
}

cudaError_t StepGraphs::flush(cudaStream_t stream, std::string* what) {
  if (pending_.empty()) return cudaSuccess;
  std::vector<Pending> ops = std::move(pending_);
  pending_.clear();
  const uint64_t sig = mix(sig_, ops.size());
  sig_ = kSeed;
  auto it = graphs_.find(sig);
  if (sightings_.size() > 4096) sightings_.clear();  // one-off shapes (prefill chunks)
  if (it == graphs_.end() && !refused_.count(sig) && ++sightings_[sig] >= 2) {
    if (graphs_.size() >= kMaxGraphs) clear();
    cudaGraphExec_t exec = capture(ops, stream);
    if (exec) {
      it = graphs_.emplace(sig, exec).first;
    } else {
      // Not capturable here: this sequence runs eagerly from now on (a real launch error
      // shows up again there, under its own name).
      ++capture_failures_;
      if (refused_.size() > 4096) refused_.clear();
      refused_.insert(sig);
    }
  }
  if (it != graphs_.end()) {
    ++replays_;
    const cudaError_t e = cudaGraphLaunch(it->second, stream);
    if (e != cudaSuccess) *what = "cudaGraphLaunch";
    return e;
  }
  for (auto& op : ops) {
    const cudaError_t e = op.launch(stream);
    if (e != cudaSuccess) {
      *what = op.what;
      return e;
    }
  }
  return cudaSuccess;
}

cudaGraphExec_t StepGraphs::capture(std::vector<Pending>& ops, cudaStream_t stream) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();  // (not sticky: cleared for the eager launches)
    return nullptr;
  }
  bool ok = true;
  for (auto& op : ops)
    if (op.launch(stream) != cudaSuccess) {
      ok = false;
      break;
    }
  cudaGraph_t graph = nullptr;
  ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok && graph;
  cudaGraphExec_t exec = nullptr;
  if (ok && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
  if (graph) cudaGraphDestroy(graph);
  if (!exec) cudaGetLastError();
  return exec;
}

}  // namespace troupe::cuda
