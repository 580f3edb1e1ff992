#pragma once
#include <CLI/CLI.hpp>

namespace troupe::app {
void add_run_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_node_command(CLI::App& app);
void add_sim_command(CLI::App& app);
void add_pipeline_command(CLI::App& app);
// The exit code set by the subcommand that ran.
int exit_code();
void set_exit_code(int code);
}  // namespace troupe::app
