// Value helpers for the chat-template engine: Python str/repr/==, json.dumps, JSON input.
#include "runtime/chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace troupe::jinja {

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(ValueList items, bool tuple) {
  Value v;
  v.kind = Kind::kList;
  v.is_tuple = tuple;
  uint32_t deepest = 0;
  for (const Value& item : items) deepest = std::max(deepest, item.depth);
  v.depth = deepest + 1;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::make_dict(ValueDict d) {
  Value v;
  v.kind = Kind::kDict;
  uint32_t deepest = 0;
  for (const auto& entry : d.entries) deepest = std::max(deepest, entry.second.depth);
  v.depth = deepest + 1;
  v.dict = std::make_shared<ValueDict>(std::move(d));
  return v;
}

namespace {
// Frees namespaces one at a time: a namespace released while another is being freed (the
// next link of a chain) waits in `pending` instead of being freed inside it, so freeing a
// chain of any length uses a bounded stack.
struct NamespaceDeleter {
  void operator()(ValueDict* d) const {
    thread_local std::vector<ValueDict*> pending;
    thread_local bool draining = false;
    pending.push_back(d);
    if (draining) return;
    draining = true;
    while (!pending.empty()) {
      ValueDict* next = pending.back();
      pending.pop_back();
      delete next;
    }
    draining = false;
  }
};
}  // namespace

Value Value::make_namespace(ValueDict d) {
  Value v;
  v.kind = Kind::kNamespace;
  v.depth = 1;
  v.dict = std::shared_ptr<ValueDict>(new ValueDict(std::move(d)), NamespaceDeleter{});
  return v;
}

Error nesting_error(uint32_t max_depth) {
  const std::string n = std::to_string(max_depth);
  return make_error("value nested deeper than " + n + " levels (max_depth=" + n + ")");
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.b;
    case Kind::kInt:
      return v.i != 0;
    case Kind::kFloat:
      return v.f != 0.0;
    case Kind::kString:
      return !v.s.empty();
    case Kind::kList:
      return !v.list->empty();
    case Kind::kDict:
      return !v.dict->entries.empty();
    case Kind::kNamespace:
      return true;
  }
  return false;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return v.is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
  }
  return "?";
}

std::string format_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's repr layout rules.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::stoi(sci.substr(e_pos + 1));
  int decpt = exponent + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = negative ? "-" : "";
  if (decpt > 16 || decpt < -3) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits + std::string(decpt - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

static std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

// str() of everything but lists and dicts.
static std::string scalar_str(const Value& v) {
  switch (v.kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.b ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return format_float(v.f);
    case Kind::kString:
      return v.s;
    case Kind::kNamespace:
      return "<Namespace>";
    default:
      return "";
  }
}

// `level`: how many lists/dicts enclose `v`.
static Status repr_into(std::string& out, const Value& v, uint32_t level, uint32_t max_depth) {
  switch (v.kind) {
    case Kind::kString:
      out += repr_string(v.s);
      return {};
    case Kind::kList: {
      if (level >= max_depth) return nesting_error(max_depth);
      out += v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        TROUPE_TRY(repr_into(out, (*v.list)[k], level + 1, max_depth));
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      out += v.is_tuple ? ")" : "]";
      return {};
    }
    case Kind::kDict: {
      if (level >= max_depth) return nesting_error(max_depth);
      out += "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": ";
        TROUPE_TRY(repr_into(out, item, level + 1, max_depth));
      }
      out += "}";
      return {};
    }
    case Kind::kUndefined:
      out += "Undefined";
      return {};
    default:
      out += scalar_str(v);
      return {};
  }
}

Result<std::string> to_repr(const Value& v, uint32_t max_depth) {
  std::string out;
  Status st = repr_into(out, v, 0, max_depth);
  if (!st.ok()) return st.error();
  return out;
}

Result<std::string> to_str(const Value& v, uint32_t max_depth) {
  if (v.is_list() || v.is_dict()) return to_repr(v, max_depth);
  return scalar_str(v);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() == b.as_double();
    return (a.kind == Kind::kBool ? a.b : a.i) == (b.kind == Kind::kBool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.s == b.s;
    case Kind::kList: {
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, item] : a.dict->entries) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(item, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return a.dict == b.dict;
    default:
      return false;
  }
}

// Escapes like Python's json.dumps; with ensure_ascii every non-ASCII code point becomes
// \uXXXX (UTF-16 surrogate pairs above the BMP).
static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  auto escape_unit = [&](uint32_t unit) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", unit);
    out += buf;
  };
  auto put_ascii = [&](unsigned char c) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          escape_unit(c);
        } else {
          out += static_cast<char>(c);
        }
    }
  };
  out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) put_ascii(c);  // bytes >= 0x80 pass through unchanged
  } else {
    for (char32_t cp : utf8_decode(s)) {
      if (cp < 0x80) {
        put_ascii(static_cast<unsigned char>(cp));
      } else if (cp < 0x10000) {
        escape_unit(cp);
      } else {
        escape_unit(0xD800 + ((cp - 0x10000) >> 10));
        escape_unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
      }
    }
  }
  out += '"';
}

// `level`: how many lists/dicts enclose `v`.
static Status json_value(std::string& out, const Value& v, const JsonOptions& o, uint32_t level) {
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  auto newline = [&](uint32_t lvl) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent) * lvl, ' ');
  };
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNamespace:
      return make_error(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
    case Kind::kNone:
      out += "null";
      return {};
    case Kind::kBool:
      out += v.b ? "true" : "false";
      return {};
    case Kind::kInt:
      out += std::to_string(v.i);
      return {};
    case Kind::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += format_float(v.f);
      return {};
    case Kind::kString:
      json_string(out, v.s, o.ensure_ascii);
      return {};
    case Kind::kList: {
      if (level >= o.max_depth) return nesting_error(o.max_depth);
      if (v.list->empty()) {
        out += "[]";
        return {};
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        TROUPE_TRY(json_value(out, (*v.list)[k], o, level + 1));
      }
      newline(level);
      out += ']';
      return {};
    }
    case Kind::kDict: {
      if (level >= o.max_depth) return nesting_error(o.max_depth);
      if (v.dict->entries.empty()) {
        out += "{}";
        return {};
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : v.dict->entries) items.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first < y->first; });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(level + 1);
        json_string(out, items[k]->first, o.ensure_ascii);
        out += o.key_separator;
        TROUPE_TRY(json_value(out, items[k]->second, o, level + 1));
      }
      newline(level);
      out += '}';
      return {};
    }
  }
  return {};
}

Result<std::string> to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  Status st = json_value(out, v, options, 0);
  if (!st.ok()) return st.error();
  return out;
}

// `level`: how many arrays/objects enclose `j`.
template <typename Json>
static Result<Value> from_json_impl(const Json& j, uint32_t level, uint32_t max_depth) {
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.template get<bool>());
  if (j.is_number_integer()) return Value::integer(j.template get<int64_t>());
  if (j.is_number_float()) return Value::real(j.template get<double>());
  if (j.is_string()) return Value::string(j.template get<std::string>());
  if ((j.is_array() || j.is_object()) && level >= max_depth) return nesting_error(max_depth);
  if (j.is_array()) {
    ValueList items;
    items.reserve(j.size());
    for (const auto& e : j) {
      auto item = from_json_impl(e, level + 1, max_depth);
      if (!item.ok()) return item.error();
      items.push_back(std::move(item.value()));
    }
    return Value::make_list(std::move(items));
  }
  if (j.is_object()) {
    ValueDict d;
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto item = from_json_impl(it.value(), level + 1, max_depth);
      if (!item.ok()) return item.error();
      d.entries.emplace_back(it.key(), std::move(item.value()));
    }
    return Value::make_dict(std::move(d));
  }
  return Value::none();  // binary and discarded values have no template meaning
}

Result<Value> from_json(const nlohmann::json& j, uint32_t max_depth) { return from_json_impl(j, 0, max_depth); }
Result<Value> from_json(const nlohmann::ordered_json& j, uint32_t max_depth) { return from_json_impl(j, 0, max_depth); }

}  // namespace troupe::jinja
