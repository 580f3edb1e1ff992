// The structured-output fields of a request body, as one GBNF grammar: OpenAI's
// `response_format: {"type": "json_schema", "json_schema": {"schema": ...}}`, vLLM's
// `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, and vLLM's newer
// `structured_outputs: {"json" | "regex" | "choice" | "grammar": ...}`. At most one may be
// given. The grammar is compiled here once to check it (and that its start is not too
// ambiguous), so a bad one is the request's 400, never a stage's failure.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace troupe {

struct StructuredOutput {
  std::string grammar;  // GBNF; empty: the request asks for none
  std::string param;    // on error: the offending field
  std::string error;    // empty: fine
  bool ok() const { return error.empty(); }
};

// body: the request object, parsed keeping key order (properties are generated in the
// schema's order).
StructuredOutput structured_output(const nlohmann::ordered_json& body);

// Empty when the grammar compiles and its start is not too ambiguous; else the reason.
// (Every grammar a request brings -- a constraint or forced tool calls -- passes this.)
std::string grammar_problem(const std::string& gbnf);

// Whether the body names any structured-output field (cheap: no grammar is built).
bool has_structured_output(const nlohmann::json& body);

}  // namespace troupe
