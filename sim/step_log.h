// Step logs: one line per engine step, its shape and its measured time, written by
// `troupe serve --step-log FILE` and read by `troupe sim calibrate --steps` and `troupe sim
// validate` (which compares every step the real server ran with the cost model). CSV:
//
//   seconds,compute_seconds,seqs
//   0.012345,0.011002,0+512* 31+1* 40+1*
//
// `seqs` lists the step's sequences as computed+new tokens, '*' when the step samples it, then
// the speculative drafts among the new tokens when it fed any (`700+8*7`).
#pragma once
#include <string>
#include <vector>

#include "sim/calibrate.h"

namespace troupe::sim {

struct LoggedStep {
  StepSample sample;           // shapes and seconds (send to result, as the scheduler sees it)
  double compute_seconds = 0;  // the workers' share
};

inline constexpr const char* kStepLogHeader = "seconds,compute_seconds,seqs\n";
std::string step_log_line(const std::vector<SeqShape>& seqs, double seconds, double compute_seconds);
// Reads a step log; a malformed line is an error naming it.
Result<std::vector<LoggedStep>> read_step_log(const std::string& path);

}  // namespace troupe::sim
