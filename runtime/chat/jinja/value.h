// Values of the Jinja subset used by chat templates (runtime/chat/chat_template.h).
// Python semantics where templates can observe them: str() of lists/dicts is Python's repr,
// floats print like Python's repr, tojson matches json.dumps(ensure_ascii=False), strings
// are UTF-8 and indexed/measured in code points.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace troupe::jinja {

struct Value;
using ValueList = std::vector<Value>;

// Insertion-ordered mapping with string keys (templates only ever index by string).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace };

// A small tagged value. Lists and dicts are shared (templates cannot mutate them: the
// sandbox is immutable); namespaces are shared on purpose, `ns.x = ...` mutates in place.
//
// Nesting: `depth` is fixed when a list or dict is made (1 + its deepest item; scalars are
// 0). The renderer rejects any value deeper than TemplateBudget::max_depth, so everything
// that walks a value recursively (repr, tojson, ==, freeing) is bounded. A namespace is
// opaque, depth 1 whatever it holds: its attributes change after it is made, nothing walks
// into it, and freeing one never recurses into the next (see make_namespace).
struct Value {
  Kind kind = Kind::kUndefined;
  bool is_tuple = false;  // kList only: prints as (a, b)
  bool b = false;
  uint32_t depth = 0;  // list/dict nesting; see above
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString; for kUndefined: a hint naming what was missing
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;  // kDict and kNamespace

  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(ValueList items, bool tuple = false);
  static Value make_dict(ValueDict d);
  // Freed iteratively: a chain of namespaces (each one's attribute holding the next) as
  // long as the loop budget allows would otherwise overflow the stack when released.
  static Value make_namespace(ValueDict d);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  double as_double() const { return kind == Kind::kFloat ? f : static_cast<double>(kind == Kind::kBool ? b : i); }
};

// Python truthiness; undefined is falsy.
bool truthy(const Value& v);
// The error for a value nested deeper than `max_depth` lists/dicts (TemplateBudget::max_depth).
Error nesting_error(uint32_t max_depth);

// Python str(): None -> "None", True -> "True", lists/dicts -> repr; undefined -> "".
// Fails (nesting_error) on a value nested deeper than max_depth, never recursing further.
Result<std::string> to_str(const Value& v, uint32_t max_depth);
// Python repr() (strings quoted); fails like to_str.
Result<std::string> to_repr(const Value& v, uint32_t max_depth);
// Python ==, including 1 == 1.0 == True and deep list/dict comparison (recursion bounded
// by the values' depth, which the renderer limits).
bool equals(const Value& a, const Value& b);
// Python type name for error messages ("str", "int", "list", "dict", "NoneType", ...).
const char* type_name(const Value& v);

struct JsonOptions {
  int indent = -1;  // < 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator;  // empty: Python's default (", " or "," with indent)
  std::string key_separator = ": ";
  uint32_t max_depth = 64;  // deeper values fail (nesting_error) instead of recursing further
};
// json.dumps with the given options; fails on undefined or namespace values.
Result<std::string> to_json(const Value& v, const JsonOptions& options);

// JSON input (template variables); fails (nesting_error) on input nested deeper than
// max_depth arrays/objects, without recursing further.
Result<Value> from_json(const nlohmann::json& j, uint32_t max_depth);
Result<Value> from_json(const nlohmann::ordered_json& j, uint32_t max_depth);

// Python repr of a float ("1.0", "0.1", "1e-05", "1e+16", "inf", "nan").
std::string format_float(double v);

// jinja_strings.cpp: UTF-8 and Python str semantics.
// UTF-8 helpers; an invalid byte decodes as a code point of its own value.
std::vector<char32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<char32_t>& cps, size_t begin, size_t end);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);
bool is_py_space(char32_t cp);      // str.isspace(), used by strip() and split()
char32_t to_upper_cp(char32_t cp);  // ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic
char32_t to_lower_cp(char32_t cp);
bool is_alpha_cp(char32_t cp);  // a cased letter (within the ranges above)

std::string map_case(const std::string& s, char32_t (*fn)(char32_t));
// str.strip/lstrip/rstrip: whitespace by default, else any code point of `chars` (a string).
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_title(const std::string& s);       // str.title()
std::string py_capitalize(const std::string& s);  // str.capitalize()
std::string jinja_title(const std::string& s);    // the `title` filter: words start after [-\s({[<]
Result<Value> py_split(const std::string& s, const Value* sep, const Value* maxsplit);  // str.split()
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);

}  // namespace troupe::jinja
