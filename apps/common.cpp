#include "apps/common.h"

#include <caf/all.hpp>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace troupe::app {

void ModelFlags::add_to(CLI::App& app) {
  app.add_option("-m,--model", model,
                 "GGUF file, Hugging Face model directory, or 'default' (SmolLM2-135M-Instruct Q4_1 from the cache); "
                 "with --load-format dummy, a config.json describing the shape (see configs/)")
      ->capture_default_str();
  app.add_option("--load-format", load_format, "auto | gguf | safetensors | dummy (random weights from a config)")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "weight type for --load-format dummy: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1")
      ->capture_default_str();
  app.add_option("-t,--threads", threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_option("--device", device,
                 "cpu, cuda or cuda:N (a CUDA GPU; needs a build with nvcc and a GPU); troupe serve also takes "
                 "cuda:N,M,...: its --pipeline-stages spread over those GPUs in order")
      ->capture_default_str();
  app.add_flag("--cuda-cublas", cuda_cublas,
               "CUDA: run batches above 8 tokens through cuBLAS, and prefill steps of 64+ tokens' attention on tensor "
               "cores (faster long prefills; a token's result then depends on its batch neighbours). Default: "
               "batch-invariant fused GEMV for every batch");
  app.add_flag("--cuda-tc-gemm", cuda_tc_gemm,
               "CUDA, batch-invariant mode: f16/bf16 weights through the tensor-core matmul at every batch size "
               "(still batch-invariant; activations rounded to the weight's type) instead of the fused GEMV; "
               "no effect with --cuda-cublas or on quantized weights (experimental: not yet measured on a GPU)");
  app.add_option("--cuda-graph-max-tokens", cuda_graph_max_tokens,
                 "CUDA: steps of at most this many tokens (decode) are captured once per shape and replayed as CUDA "
                 "graphs (the same bits as eager launches on the host-run fake; not yet re-checked on a GPU; a "
                 "step that cannot be captured runs eagerly); 0 turns graphs off")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
  app.add_option("-c,--ctx", ctx, "context length in tokens (capped by the model's)")->capture_default_str();
  app.add_option("-b,--batch", batch, "largest number of tokens per forward step (prompt chunk)")
      ->capture_default_str();
}

void progress_bar(const char* what, size_t done, size_t total) {
  static const bool tty = isatty(STDERR_FILENO);
  if (!tty && done != total) return;
  const int width = 30;
  const int fill = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu", what, fill, "##############################", width - fill, "", done,
               total);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

Result<ModelFiles> open_model_files(const ModelFlags& flags) {
  OpenOptions oo;
  oo.load_format = flags.load_format;
  oo.dummy_dtype = flags.dtype;
  return open_model(flags.model, oo);
}

Result<LoadedEngine> load_engine(const ModelFlags& flags) {
  LoadedEngine e;
  const auto t0 = std::chrono::steady_clock::now();
  auto files = open_model_files(flags);
  if (!files) return files.error();
  e.files = std::move(*files);
  if (flags.threads < 0 || flags.threads > 1024) return make_error("--threads must be 0..1024");
  if (flags.batch <= 0 || flags.batch > 65536) return make_error("--batch must be 1..65536");
  auto backend = make_backend(flags.device, flags.threads, flags.cuda_options());
  if (!backend) return backend.error();
  e.backend = std::move(*backend);
  auto model = Model::build(e.files.config, *e.files.weights, *e.backend, flags.batch,
                            [](size_t d, size_t t) { progress_bar("loading", d, t); });
  if (!model) return model.error();
  e.model = std::move(*model);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& c = e.files.config;
  spdlog::info("loaded {} ({}, {}): {}, on {} in {:.2f} s", e.files.path, e.files.format, c.arch, shape_summary(c),
               e.backend->name(), secs);
  return e;
}

void configure_actor_system(caf::actor_system_config& cfg) {
  cfg.set("scheduler.max-threads", 2);
  // Idle CAF workers wait on a condition variable at once instead of polling: on a machine
  // where the stage workers use every core, polling threads would steal their time.
  cfg.set("work-stealing.aggressive-poll-attempts", 20);
  cfg.set("work-stealing.moderate-poll-attempts", 0);
  cfg.set("logger.file-verbosity", caf::atom("quiet"));
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
}

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "::1" || host == "localhost"; }

std::string shape_summary(const ModelConfig& c) {
  std::string s = fmt::format("{} layers, hidden {}, heads {}/{}, vocab {}", c.num_layers, c.hidden, c.num_heads,
                              c.num_kv_heads, c.vocab);
  if (c.moe.enabled())
    s += fmt::format(", {} experts, {} per token{}", c.moe.num_experts, c.moe.experts_per_tok,
                     c.moe.shared_ffn > 0 ? ", a shared expert" : "");
  return s;
}

}  // namespace troupe::app
