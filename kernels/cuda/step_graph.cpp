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
  if (it == graphs_.end() && ++sightings_[sig] >= 2) {
    if (graphs_.size() >= kMaxGraphs) clear();
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      *what = "cudaStreamBeginCapture";
      return e;
    }
    cudaError_t failed = cudaSuccess;
    for (auto& op : ops) {
      failed = op.launch(stream);
      if (failed != cudaSuccess) {
        *what = op.what;
        break;
      }
    }
    cudaGraph_t graph = nullptr;
    e = cudaStreamEndCapture(stream, &graph);
    if (failed != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      return failed;
    }
    if (e != cudaSuccess) {
      *what = "cudaStreamEndCapture";
      return e;
    }
    cudaGraphExec_t exec = nullptr;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      *what = "cudaGraphInstantiate";
      return e;
    }
    it = graphs_.emplace(sig, exec).first;
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

}  // namespace troupe::cuda
