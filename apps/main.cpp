// troupe: one executable, one subcommand per job.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "apps/subcommands.h"

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("troupe"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  CLI::App app{"troupe: an actor-based LLM inference runtime"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(log_level)); });
  troupe::app::add_run_command(app);
  troupe::app::add_bench_command(app);
  troupe::app::add_serve_command(app);
  troupe::app::add_node_command(app);
  troupe::app::add_sim_command(app);
  troupe::app::add_pipeline_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return app.exit(e); }
  return troupe::app::exit_code();
}
