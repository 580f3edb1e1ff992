// Builtin filters, tests, methods and functions of the chat-template subset, with the
// Python/Jinja semantics templates observe (str.strip strips Unicode whitespace, lengths
// count code points, `string is iterable`, ...).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <set>

#include "runtime/chat/jinja/eval.h"

namespace troupe::jinja {

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool is_known_filter(const std::string& n) {
  static const std::set<std::string> kNames = {
      "trim",    "length",     "count",      "upper",  "lower",  "capitalize", "title", "default", "d",
      "tojson",  "string",     "int",        "float",  "join",   "first",      "last",  "list",    "items",
      "replace", "selectattr", "rejectattr", "select", "reject", "map",        "safe",  "abs",     "reverse"};
  return kNames.count(n) > 0;
}

bool is_known_test(const std::string& n) {
  static const std::set<std::string> kNames = {
      "defined", "undefined", "none", "string", "mapping", "iterable",    "sequence", "number", "integer",
      "float",   "boolean",   "true", "false",  "equalto", "eq",          "ne",       "lt",     "gt",
      "le",      "ge",        "in",   "odd",    "even",    "divisibleby", "lower",    "upper",  "sameas"};
  return kNames.count(n) > 0;
}

bool is_known_function(const std::string& n) {
  return n == "range" || n == "namespace" || n == "raise_exception" || n == "strftime_now" || n == "dict";
}

bool is_known_method(const std::string& n) {
  static const std::set<std::string> kNames = {"strip", "lstrip", "rstrip", "split",      "startswith", "endswith",
                                               "upper", "lower",  "title",  "capitalize", "replace",    "join",
                                               "find",  "count",  "items",  "keys",       "values",     "get"};
  return kNames.count(n) > 0;
}

namespace {

Error undefined_error(const Value& v) { return make_error(v.s.empty() ? "value is undefined" : v.s); }

Result<bool> affix_match(const std::string& s, const Value* affix, bool prefix) {
  if (!affix) return make_error("startswith/endswith needs an argument");
  ValueList options = affix->is_list() ? *affix->list : ValueList{*affix};
  for (const Value& o : options) {
    if (!o.is_string()) return make_error("startswith/endswith argument must be str or a tuple of str");
    if (o.s.size() <= s.size() &&
        (prefix ? s.compare(0, o.s.size(), o.s) == 0 : s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0)) {
      return true;
    }
  }
  return false;
}

// Jinja's attribute getter for selectattr/map/join: dotted paths, subscript semantics.
Result<Value> attribute_path(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    char* end = nullptr;
    long long index = std::strtoll(part.c_str(), &end, 10);
    bool numeric = !part.empty() && end && *end == '\0';
    auto next = get_item(cur, numeric ? Value::integer(index) : Value::string(part));
    if (!next.ok()) return next.error();
    cur = std::move(next.value());
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Result<Value> select_filter(const std::string& name, const Value& subject, const CallArgs& args) {
  bool by_attr = name == "selectattr" || name == "rejectattr";
  bool want = name == "select" || name == "selectattr";
  auto items = iterate(subject);
  if (!items.ok()) return items.error();
  size_t first_test_arg = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string())
      return make_error(name + " needs an attribute name");
    attr = args.positional[0].s;
  }
  std::string test;
  CallArgs test_args;
  test_args.max_depth = args.max_depth;
  if (args.positional.size() > first_test_arg) {
    if (!args.positional[first_test_arg].is_string()) return make_error(name + ": test name must be a string");
    test = args.positional[first_test_arg].s;
    if (!is_known_test(test)) return make_error(name + ": unsupported test '" + test + "'");
    test_args.positional.assign(args.positional.begin() + first_test_arg + 1, args.positional.end());
  }
  ValueList out;
  for (const Value& item : items.value()) {
    Value probe = item;
    if (by_attr) {
      auto got = attribute_path(item, attr);
      if (!got.ok()) return got.error();
      probe = std::move(got.value());
    }
    bool ok;
    if (test.empty()) {
      ok = truthy(probe);
    } else {
      auto r = apply_test(test, probe, test_args);
      if (!r.ok()) return r.error();
      ok = r.value();
    }
    if (ok == want) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Result<Value> map_filter(const Value& subject, const CallArgs& args) {
  auto items = iterate(subject);
  if (!items.ok()) return items.error();
  ValueList out;
  if (const Value* attr = args.get(99, "attribute")) {
    const Value* dflt = args.get(99, "default");
    auto path = to_str(*attr, args.max_depth);
    if (!path.ok()) return path.error();
    for (const Value& item : items.value()) {
      auto got = attribute_path(item, path.value());
      if (!got.ok()) return got.error();
      out.push_back(got.value().is_undefined() && dflt ? *dflt : got.value());
    }
    return Value::make_list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    return make_error("map needs a filter name or attribute=");
  const std::string filter = args.positional[0].s;
  if (!is_known_filter(filter) || filter == "map") return make_error("map: unsupported filter '" + filter + "'");
  CallArgs rest;
  rest.max_depth = args.max_depth;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items.value()) {
    auto r = apply_filter(filter, item, rest);
    if (!r.ok()) return r.error();
    out.push_back(std::move(r.value()));
  }
  return Value::make_list(std::move(out));
}

// int()/float() filters: Python parsing with Jinja's fallbacks ("42.7"|int == 42).
bool parse_number(const std::string& text, double* out) {
  std::string t = strip(text, nullptr, true, true);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  // strtod also reads hex floats ("0x1A"); Python's float() does not.
  if (t.empty() || t.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end && *end == '\0';
}

Result<Value> to_int(const Value& v, const CallArgs& args) {
  const Value* dflt = args.get(0, "default");
  Value fallback = dflt ? *dflt : Value::integer(0);
  switch (v.kind) {
    case Kind::kInt:
      return v;
    case Kind::kBool:
      return Value::integer(v.b);
    case Kind::kFloat:
      if (!std::isfinite(v.f)) return fallback;
      return Value::integer(static_cast<int64_t>(v.f));
    case Kind::kString: {
      std::string t = strip(v.s, nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      long long n = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end && *end == '\0' && errno == 0) return Value::integer(n);
      double d;
      if (parse_number(v.s, &d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return Value::integer(static_cast<int64_t>(d));
      return fallback;
    }
    default:
      return fallback;
  }
}

Result<Value> to_json_filter(const Value& v, const CallArgs& args) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonOptions o;
  o.max_depth = args.max_depth;
  if (const Value* a = args.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*a);
  if (const Value* a = args.get(1, "indent"); a && !a->is_none()) {
    if (a->kind != Kind::kInt) return make_error("tojson: indent must be an integer");
    o.indent = static_cast<int>(std::clamp<int64_t>(a->i, 0, 64));
  }
  if (const Value* a = args.get(2, "separators"); a && !a->is_none()) {
    if (!a->is_list() || a->list->size() != 2 || !(*a->list)[0].is_string() || !(*a->list)[1].is_string()) {
      return make_error("tojson: separators must be a pair of strings");
    }
    o.item_separator = (*a->list)[0].s;
    o.key_separator = (*a->list)[1].s;
  }
  if (const Value* a = args.get(3, "sort_keys")) o.sort_keys = truthy(*a);
  auto s = to_json(v, o);
  if (!s.ok()) return s.error();
  return Value::string(std::move(s.value()));
}

}  // namespace

Result<Value> get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
}

Result<Value> get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (key.is_string()) return get_attr(obj, key.s);
  if ((key.kind == Kind::kInt || key.kind == Kind::kBool) && (obj.is_list() || obj.is_string())) {
    int64_t index = key.kind == Kind::kBool ? key.b : key.i;
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (index < 0) index += n;
      if (index >= 0 && index < n) return (*obj.list)[index];
    } else {
      auto cps = utf8_decode(obj.s);
      int64_t n = static_cast<int64_t>(cps.size());
      if (index < 0) index += n;
      if (index >= 0 && index < n) return Value::string(utf8_encode(cps, index, index + 1));
    }
    return Value::undefined(std::string(type_name(obj)) + " index out of range");
  }
  auto shown = to_repr(key, 4);  // only a hint: a deeper key shows as its type
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no item " +
                          (shown.ok() ? shown.value() : std::string(type_name(key))));
}

Result<Value> get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (!obj.is_list() && !obj.is_string())
    return make_error(std::string("'") + type_name(obj) + "' object is not subscriptable");
  for (const Value* v : {&start_v, &stop_v, &step_v}) {
    if (!v->is_none() && v->kind != Kind::kInt) return make_error("slice indices must be integers or None");
  }
  std::vector<char32_t> cps;
  if (obj.is_string()) cps = utf8_decode(obj.s);
  int64_t n = obj.is_list() ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(cps.size());
  int64_t step = step_v.is_none() ? 1 : step_v.i;
  if (step == 0) return make_error("slice step cannot be zero");
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t x = v.i;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t start = adjust(start_v, step < 0 ? n - 1 : 0);
  int64_t stop = adjust(stop_v, step < 0 ? -1 : n);
  ValueList items;
  std::vector<char32_t> chars;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (obj.is_list())
      items.push_back((*obj.list)[k]);
    else
      chars.push_back(cps[k]);
  }
  if (obj.is_list()) return Value::make_list(std::move(items), obj.is_tuple);
  return Value::string(utf8_encode(chars, 0, chars.size()));
}

Result<ValueList> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return ValueList{};
    case Kind::kList:
      return *v.list;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& [k, item] : v.dict->entries) keys.push_back(Value::string(k));
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (char32_t cp : utf8_decode(v.s)) {
        std::string one;
        utf8_append(one, cp);
        chars.push_back(Value::string(std::move(one)));
      }
      return chars;
    }
    default:
      return make_error(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

Result<Value> apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "safe") return v;
  if (name == "default" || name == "d") {
    const Value* dflt = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    bool use_default = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    return use_default ? (dflt ? *dflt : Value::string("")) : v;
  }
  if (name == "trim" || name == "upper" || name == "lower" || name == "capitalize" || name == "title" ||
      name == "string") {
    auto text = to_str(v, args.max_depth);
    if (!text.ok()) return text.error();
    std::string& s = text.value();
    if (name == "trim") return Value::string(strip(s, args.get(0, "chars"), true, true));
    if (name == "upper") return Value::string(map_case(s, to_upper_cp));
    if (name == "lower") return Value::string(map_case(s, to_lower_cp));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "title") return Value::string(jinja_title(s));
    return Value::string(std::move(s));
  }
  if (name == "tojson") return to_json_filter(v, args);
  if (name == "int") return to_int(v, args);
  if (name == "float") {
    double d;
    if (v.is_number()) return Value::real(v.as_double());
    if (v.is_string() && parse_number(v.s, &d)) return Value::real(d);
    const Value* dflt = args.get(0, "default");
    return dflt ? *dflt : Value::real(0.0);
  }
  if (name == "abs") {
    if (v.kind == Kind::kFloat) return Value::real(std::fabs(v.f));
    if (v.is_number()) return Value::integer(std::llabs(v.kind == Kind::kBool ? v.b : v.i));
    return make_error(std::string("bad operand type for abs(): '") + type_name(v) + "'");
  }
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Kind::kUndefined:
        return Value::integer(0);
      case Kind::kString:
        return Value::integer(static_cast<int64_t>(utf8_length(v.s)));
      case Kind::kList:
        return Value::integer(static_cast<int64_t>(v.list->size()));
      case Kind::kDict:
        return Value::integer(static_cast<int64_t>(v.dict->entries.size()));
      default:
        return make_error(std::string("object of type '") + type_name(v) + "' has no len()");
    }
  }
  if (name == "replace") {
    const Value* from = args.get(0, "old");
    const Value* to = args.get(1, "new");
    const Value* count = args.get(2, "count");
    if (!from || !to) return make_error("replace needs old and new");
    int64_t n = count && count->kind == Kind::kInt ? count->i : -1;
    auto s = to_str(v, args.max_depth);
    if (!s.ok()) return s.error();
    auto old_s = to_str(*from, args.max_depth);
    if (!old_s.ok()) return old_s.error();
    auto new_s = to_str(*to, args.max_depth);
    if (!new_s.ok()) return new_s.error();
    return Value::string(py_replace(s.value(), old_s.value(), new_s.value(), n));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    return select_filter(name, v, args);
  }
  if (name == "map") return map_filter(v, args);
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list({});
    return call_method(v, "items", {});
  }
  auto items = iterate(v);
  if (!items.ok()) return items.error();
  ValueList& list = items.value();
  if (name == "list") return Value::make_list(std::move(list));
  if (name == "first" || name == "last") {
    if (list.empty()) return Value::undefined("no first/last item of an empty sequence");
    return name == "first" ? list.front() : list.back();
  }
  if (name == "reverse") {
    std::reverse(list.begin(), list.end());
    if (v.is_string()) {
      std::string out;
      for (const Value& c : list) out += c.s;
      return Value::string(std::move(out));
    }
    return Value::make_list(std::move(list));
  }
  if (name == "join") {
    const Value* sep_v = args.get(0, "d");
    const Value* attr_v = args.get(1, "attribute");
    auto sep = to_str(sep_v ? *sep_v : Value::string(""), args.max_depth);
    if (!sep.ok()) return sep.error();
    auto attr = to_str(attr_v ? *attr_v : Value::string(""), args.max_depth);
    if (!attr.ok()) return attr.error();
    std::string out;
    for (size_t k = 0; k < list.size(); ++k) {
      if (k) out += sep.value();
      Value item = list[k];
      if (attr_v) {
        auto got = attribute_path(item, attr.value());
        if (!got.ok()) return got.error();
        item = std::move(got.value());
      }
      auto text = to_str(item, args.max_depth);
      if (!text.ok()) return text.error();
      out += text.value();
    }
    return Value::string(std::move(out));
  }
  return make_error("unsupported filter '" + name + "'");
}

Result<bool> apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  const Value* other = args.get(0, "other");
  auto need_other = [&]() -> Result<const Value*> {
    if (!other) return make_error("test '" + name + "' needs an argument");
    return other;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.b;
  if (name == "false") return v.kind == Kind::kBool && !v.b;
  if (name == "lower" || name == "upper") {
    auto s = to_str(v, args.max_depth);
    if (!s.ok()) return s.error();
    bool any_cased = false;
    for (char32_t cp : utf8_decode(s.value())) {
      if (!is_alpha_cp(cp)) continue;
      any_cased = true;
      if ((name == "lower" ? to_lower_cp(cp) : to_upper_cp(cp)) != cp) return false;
    }
    return any_cased;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != Kind::kInt && v.kind != Kind::kBool) return make_error("test '" + name + "' needs an integer");
    int64_t x = v.kind == Kind::kBool ? v.b : v.i;
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    auto o = need_other();
    if (!o.ok()) return o.error();
    if (o.value()->kind != Kind::kInt || o.value()->i == 0) return make_error("divisibleby needs a non-zero integer");
    return x % o.value()->i == 0;
  }
  auto o = need_other();
  if (!o.ok()) return o.error();
  const Value& b = *o.value();
  if (name == "equalto" || name == "eq") return equals(v, b);
  if (name == "ne") return !equals(v, b);
  if (name == "sameas") {
    if (v.kind != b.kind) return false;
    if (v.is_list()) return v.list == b.list;
    if (v.is_dict() || v.kind == Kind::kNamespace) return v.dict == b.dict;
    return v.is_none() || v.is_undefined() || (v.kind == Kind::kBool && v.b == b.b);
  }
  if (name == "in") {
    if (b.is_string()) return v.is_string() && b.s.find(v.s) != std::string::npos;
    if (b.is_dict()) return v.is_string() && b.dict->find(v.s) != nullptr;
    auto items = iterate(b);
    if (!items.ok()) return items.error();
    for (const Value& item : items.value()) {
      if (equals(item, v)) return true;
    }
    return false;
  }
  // lt/gt/le/ge on numbers and strings.
  int cmp;
  if (v.is_number() && b.is_number()) {
    cmp = v.as_double() < b.as_double() ? -1 : v.as_double() > b.as_double() ? 1 : 0;
  } else if (v.is_string() && b.is_string()) {
    cmp = v.s.compare(b.s);
  } else {
    return make_error(std::string("test '") + name + "' not supported between '" + type_name(v) + "' and '" +
                      type_name(b) + "'");
  }
  if (name == "lt") return cmp < 0;
  if (name == "gt") return cmp > 0;
  if (name == "le") return cmp <= 0;
  return cmp >= 0;  // ge
}

Result<Value> call_method(const Value& obj, const std::string& name, const CallArgs& args) {
  if (obj.is_undefined()) return undefined_error(obj);
  if (obj.is_dict()) {
    const auto& entries = obj.dict->entries;
    if (name == "items" || name == "keys" || name == "values") {
      ValueList out;
      for (const auto& [k, v] : entries) {
        if (name == "items")
          out.push_back(Value::make_list({Value::string(k), v}, true));
        else
          out.push_back(name == "keys" ? Value::string(k) : v);
      }
      return Value::make_list(std::move(out));
    }
    if (name == "get") {
      const Value* key = args.get(0, "key");
      const Value* dflt = args.get(1, "default");
      if (!key) return make_error("get() needs a key");
      const Value* found = key->is_string() ? obj.dict->find(key->s) : nullptr;
      return found ? *found : (dflt ? *dflt : Value::none());
    }
  }
  if (obj.is_string()) {
    const std::string& s = obj.s;
    if (name == "strip") return Value::string(strip(s, args.get(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(strip(s, args.get(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(strip(s, args.get(0, "chars"), false, true));
    if (name == "upper") return Value::string(map_case(s, to_upper_cp));
    if (name == "lower") return Value::string(map_case(s, to_lower_cp));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "split") return py_split(s, args.get(0, "sep"), args.get(1, "maxsplit"));
    if (name == "startswith" || name == "endswith") {
      auto r = affix_match(s, args.get(0, "prefix"), name == "startswith");
      if (!r.ok()) return r.error();
      return Value::boolean(r.value());
    }
    if (name == "replace") {
      const Value* from = args.get(0, "old");
      const Value* to = args.get(1, "new");
      const Value* count = args.get(2, "count");
      if (!from || !to || !from->is_string() || !to->is_string()) return make_error("replace() needs two strings");
      return Value::string(py_replace(s, from->s, to->s, count && count->kind == Kind::kInt ? count->i : -1));
    }
    if (name == "find" || name == "count") {
      const Value* sub = args.get(0, "sub");
      if (!sub || !sub->is_string()) return make_error(name + "() needs a string");
      if (name == "find") {
        size_t at = s.find(sub->s);
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(s.substr(0, at))));
      }
      if (sub->s.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub->s); at != std::string::npos; at = s.find(sub->s, at + sub->s.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value* seq = args.get(0, "iterable");
      if (!seq) return make_error("join() needs an iterable");
      auto items = iterate(*seq);
      if (!items.ok()) return items.error();
      std::string out;
      for (size_t k = 0; k < items.value().size(); ++k) {
        const Value& item = items.value()[k];
        if (!item.is_string()) return make_error("join() items must be strings");
        if (k) out += s;
        out += item.s;
      }
      return Value::string(std::move(out));
    }
  }
  return make_error(std::string("'") + type_name(obj) + "' object has no method '" + name + "'");
}

Result<Value> call_function(const std::string& name, const CallArgs& args, uint64_t max_items) {
  if (name == "raise_exception") {
    const Value* msg = args.get(0, "message");
    if (!msg) return make_error("raise_exception called");
    auto text = to_str(*msg, args.max_depth);
    return make_error(text.ok() ? text.value() : text.error().message);
  }
  if (name == "namespace" || name == "dict") {
    ValueDict d;
    if (!args.positional.empty()) {
      if (!args.positional[0].is_dict() || args.positional.size() > 1) return make_error(name + "() takes one mapping");
      d = *args.positional[0].dict;
    }
    for (const auto& [k, v] : args.keyword) d.set(k, v);
    return name == "dict" ? Value::make_dict(std::move(d)) : Value::make_namespace(std::move(d));
  }
  if (name == "range") {
    if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
      return make_error("range() takes 1 to 3 integer arguments");
    }
    int64_t v[3] = {0, 0, 1};
    for (size_t k = 0; k < args.positional.size(); ++k) {
      const Value& a = args.positional[k];
      if (a.kind != Kind::kInt && a.kind != Kind::kBool) return make_error("range() arguments must be integers");
      v[args.positional.size() == 1 ? 1 : k] = a.kind == Kind::kBool ? a.b : a.i;
    }
    if (v[2] == 0) return make_error("range() arg 3 must not be zero");
    // Count before building so a huge range fails without allocating.
    __int128 span = static_cast<__int128>(v[1]) - v[0];
    __int128 step = v[2];
    __int128 count = (span > 0) == (step > 0) && span != 0 ? (span + step - (step > 0 ? 1 : -1)) / step : 0;
    if (count > static_cast<__int128>(max_items)) {
      return make_error("loop budget exceeded: range() of " + std::to_string(static_cast<uint64_t>(count)) +
                        " items (max_loop_iterations=" + std::to_string(max_items) + ")");
    }
    ValueList out;
    for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) out.push_back(Value::integer(v[0] + k * v[2]));
    return Value::make_list(std::move(out));
  }
  if (name == "strftime_now") {
    const Value* fmt = args.get(0, "format");
    if (!fmt || !fmt->is_string()) return make_error("strftime_now() needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    size_t n = std::strftime(buf, sizeof(buf), fmt->s.c_str(), &local);
    if (n == 0 && !fmt->s.empty()) return make_error("strftime_now(): format too long or empty result");
    return Value::string(std::string(buf, n));
  }
  return make_error("unsupported function '" + name + "'");
}

}  // namespace troupe::jinja
