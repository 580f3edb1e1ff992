// Structured-output requests as GBNF text (runtime/grammar/grammar.h): a JSON schema
// (OpenAI's response_format json_schema, vLLM's guided_json), a regex (guided_regex), a
// list of choices (guided_choice). The text is what the sampler's constraint compiles.
//
// The JSON-schema subset (docs/serving.md, "Structured output", lists it with examples):
//   type (string, number, integer, boolean, null, object, array, or a list of them), enum,
//   const, properties, required, additionalProperties (false, true or a schema; absent
//   means no extra keys are generated -- the output is still valid), items, minItems,
//   maxItems, minLength, maxLength, pattern (ECMA-style regex subset, unanchored as the
//   standard says unless ^/$), format (date, time, date-time, uuid), anyOf, oneOf (as
//   anyOf), allOf with one schema, $ref to "#", "#/$defs/..." or "#/definitions/...",
//   integer minimum >= 0; annotations (title, description, default, examples, $schema,
//   $id, $comment, deprecated, readOnly, writeOnly) are ignored. Any other keyword is an
//   error naming it and where it is. Properties are generated in the schema's order.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace troupe {

struct SchemaLimits {
  int32_t max_depth = 32;       // nested subschemas
  size_t max_enum = 1024;       // enum values
  size_t max_properties = 256;  // per object
  int32_t max_length = 4096;    // minLength/maxLength/minItems/maxItems
  size_t max_grammar_bytes = 1u << 20;
};

// The schema's grammar: one JSON value valid against it, with bounded whitespace. Its start
// rule is `root_name` (another name lets a caller embed it in a grammar of its own).
Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaLimits& lim = {},
                                        const std::string& root_name = "root");

// The regex as GBNF matching exactly the strings it fully matches (Python's re.fullmatch).
// Supported: literals, escapes (\d \w \s \D \W \S \t \n \r \xHH \uHHHH and escaped
// punctuation), classes with ranges and negation, '.', groups ((...) and (?:...)),
// alternation, * + ? {m} {m,} {m,n} (lazy forms accepted, matched the same), ^ at the start
// and $ at the end. Backreferences, lookaround, flags and other anchors are errors.
Result<std::string> regex_to_gbnf(std::string_view regex, int32_t max_repeat = 4096);

// A rule body (no "root ::=") for the regex inside a JSON string's quotes: characters the
// JSON string must escape are written escaped. unanchored: the pattern may match anywhere
// (JSON Schema's `pattern`), unless it starts with ^ / ends with $.
Result<std::string> regex_to_gbnf_body(std::string_view regex, bool json_string, bool unanchored, int32_t max_repeat);

// Exactly one of the strings.
Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices);

// A GBNF literal ("...") of the bytes, escaped.
std::string gbnf_literal(std::string_view bytes);

}  // namespace troupe
