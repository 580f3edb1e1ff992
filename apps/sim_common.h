// Shared by the `troupe sim` subcommands (apps/sim_*.cpp).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace troupe::app {

// A path inside the source tree (defaults for configs and profiles).
inline std::string sim_source_path(const std::string& rel) {
#ifdef TROUPE_SOURCE_DIR
  return std::string(TROUPE_SOURCE_DIR) + "/" + rel;
#else
  return rel;
#endif
}

void add_sim_calibrate(CLI::App& sim);
void add_sim_validate(CLI::App& sim);

}  // namespace troupe::app
