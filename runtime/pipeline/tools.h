// The tools a pipeline's tool nodes may call (issue 36), each bounded in time and output:
//   calculator     an arithmetic expression (+ - * / % ^, parentheses, unary minus, decimal
//                  numbers): the one in the input with the most operators (ties: the
//                  first), evaluated in
//                  double precision; at most 256 bytes and 32 levels of nesting;
//   regex_extract  the first match of a PCRE2 pattern (its first group when it has one),
//                  with PCRE2's match and depth limits so a pathological pattern fails fast;
//   json_extract   the value of a key in the first JSON object of the input.
// Every failure is an error with a message the run reports as the node's typed error.
#pragma once
#include <string>

#include "common/result.h"

namespace troupe {

constexpr size_t kToolMaxOutput = 4096;  // bytes a tool may return

// The value of `expr` (the whole string): digits, '.', + - * / % ^ ( ) and spaces only.
Result<double> calculate(const std::string& expr);
// A number as the calculator prints it: an integer without a fraction, else up to 12
// significant digits.
std::string format_number(double v);

// Runs tool `name` over `input` with `pattern` (regex_extract, json_extract).
Result<std::string> run_tool(const std::string& name, const std::string& input, const std::string& pattern);

}  // namespace troupe
