// Shared by the `troupe sim` subcommands (apps/sim_*.cpp).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "apps/local_engine.h"
#include "apps/serve_client.h"
#include "sim/cost_model.h"

namespace troupe::app {

// A path inside the source tree (defaults for configs and profiles).
inline std::string sim_source_path(const std::string& rel) {
#ifdef TROUPE_SOURCE_DIR
  return std::string(TROUPE_SOURCE_DIR) + "/" + rel;
#else
  return rel;
#endif
}

// The simulated layout of the expert flags: their workers (0 without them), sharing the machine.
inline Result<sim::Layout> expert_layout(const ExpertFlags& f, const ModelConfig& cfg) {
  sim::Layout layout;
  if (!f.enabled()) return layout;
  auto p = f.placement_for(cfg);
  if (!p) return p.error();
  layout.expert_workers = static_cast<int32_t>(p->workers.size());
  return layout;
}

// The real server started with the same expert flags.
inline void set_serve_experts(const ExpertFlags& f, ServeSpec& spec) {
  spec.expert_parallel = f.parallel;
  spec.expert_placement = f.placement;
  spec.expert_threads = f.threads;
  spec.node_key_file = f.key_file;
}

void add_sim_calibrate(CLI::App& sim);
void add_sim_validate(CLI::App& sim);

}  // namespace troupe::app
