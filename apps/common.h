// Shared wiring for subcommands: flags that load a model, the progress bar, the backend.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"

namespace caf {
class actor_system_config;
}

namespace troupe::app {

// The actor system settings of a serving process (`serve`, `node`): two scheduler threads,
// idle workers that sleep instead of polling, CAF's own logger quiet.
void configure_actor_system(caf::actor_system_config& cfg);
// 127.0.0.1, ::1 or localhost: addresses only this machine can reach.
bool is_loopback(const std::string& host);

struct ModelFlags {
  std::string model = "default";
  std::string load_format = "auto";
  std::string dtype = "bf16";
  int threads = 0;
  std::string device = "cpu";
  bool cuda_cublas = false;
  int cuda_graph_max_tokens = 64;
  bool cuda_tc_gemm = false;
  int ctx = 4096;
  int batch = 512;
  void add_to(CLI::App& app);
  CudaBackendOptions cuda_options() const {
    CudaBackendOptions o;
    o.batch_invariant = !cuda_cublas;
    o.graph_max_tokens = cuda_graph_max_tokens;
    o.tc_gemm = cuda_tc_gemm;
    return o;
  }
};

struct LoadedEngine {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

// Opens the model files the flags name (path or 'default', load format, dummy dtype).
Result<ModelFiles> open_model_files(const ModelFlags& flags);

// Opens the files, builds the backend and the model with a progress bar on stderr.
Result<LoadedEngine> load_engine(const ModelFlags& flags);

void progress_bar(const char* what, size_t done, size_t total);

// "30 layers, hidden 576, heads 9/3, vocab 49152" (+ ", 8 experts, 2 per token" for MoE).
std::string shape_summary(const ModelConfig& c);

}  // namespace troupe::app
