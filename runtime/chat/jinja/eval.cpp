// Tree-walking renderer for parsed chat templates. Scoping follows Jinja: a for-loop body
// gets a fresh scope per iteration (its `set`s do not leak), `if` shares its parent's;
// namespace objects are shared, so `ns.x = ...` is the way to carry state out of a loop.
// Every budget in TemplateBudget is checked where it can be exceeded; max_depth bounds the
// nesting of statements and expressions, and of values (every expression's result).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "runtime/chat/jinja/eval.h"

namespace troupe::jinja {
namespace {

#define JINJA_EVAL(var, expr)                          \
  auto var##_result = (expr);                          \
  if (!var##_result.ok()) return var##_result.error(); \
  Value var = std::move(var##_result.value())

enum class Flow { kNormal, kBreak, kContinue };

std::string op_error(const std::string& op, const Value& a, const Value& b) {
  return "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'";
}

int64_t int_of(const Value& v) { return v.kind == Kind::kBool ? v.b : v.i; }

Result<Value> arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) return make_error(op_error(op, a, b));
  bool ints = a.kind != Kind::kFloat && b.kind != Kind::kFloat;
  if (ints && op != "/") {
    int64_t x = int_of(a), y = int_of(b), r = 0;
    if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::integer(r);
    if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::integer(r);
    if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::integer(r);
    if (op == "//" || op == "%") {
      if (y == 0) return make_error("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return make_error("integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors
      return Value::integer(op == "//" ? q : m);
    }
    if (op == "**" && y >= 0) {
      int64_t result = 1;
      for (int64_t k = 0; k < y; ++k) {
        if (__builtin_mul_overflow(result, x, &result)) return make_error("integer overflow in '**'");
        if (result == 0 || result == 1) break;
      }
      if (result == 1 && x == -1 && y % 2 == 1) result = -1;
      return Value::integer(result);
    }
    if (op != "**") return make_error("integer overflow in '" + op + "'");
  }
  double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::real(x + y);
  if (op == "-") return Value::real(x - y);
  if (op == "*") return Value::real(x * y);
  if (op == "**") return Value::real(std::pow(x, y));
  if (y == 0) return make_error("float division by zero");
  if (op == "/") return Value::real(x / y);
  double q = std::floor(x / y);
  if (op == "//") return Value::real(q);
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value::real(m);
}

// -1, 0, 1 for the Python orderings templates use (numbers, strings, lists).
Result<int> compare(const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s.compare(b.s);  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  return make_error("'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) +
                    "'");
}

Result<bool> contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      return make_error(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
    return container.s.find(item.s) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.dict->find(item.s) != nullptr;
  if (container.is_list()) {
    for (const Value& v : *container.list) {
      if (equals(v, item)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  return make_error(std::string("argument of type '") + type_name(container) + "' is not iterable");
}

class Renderer {
 public:
  Renderer(const ValueDict& vars, const TemplateBudget& budget)
      : budget_(budget), start_(std::chrono::steady_clock::now()) {
    scopes_.emplace_back();
    for (const auto& [k, v] : vars.entries) scopes_.back()[k] = v;
  }

  // Namespaces can hold themselves (`ns.x = [ns]`), which reference counting never frees:
  // empty every namespace still alive.
  ~Renderer() {
    for (auto& weak : namespaces_) {
      if (auto d = weak.lock()) {
        auto entries = std::move(d->entries);
        d->entries.clear();
      }
    }
  }

  Result<std::string> run(const Body& body) {
    Flow flow = Flow::kNormal;
    TROUPE_TRY(exec_body(body, &flow));
    return std::move(out_);
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(uint32_t* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    uint32_t* depth;
  };

  Status check_depth(int line) const {
    if (depth_ > budget_.max_depth) {
      return error_at(line, "depth budget exceeded (max_depth=" + std::to_string(budget_.max_depth) + ")");
    }
    return {};
  }

  // Values nest at most max_depth lists/dicts deep, so nothing that walks one recursively
  // (str, tojson, ==, freeing) can exhaust the stack.
  Status check_nesting(const Value& v, int line) const {
    if (v.depth > budget_.max_depth) return error_at(line, nesting_error(budget_.max_depth).message);
    return {};
  }

  Status check_time(int line) const {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (elapsed > budget_.max_seconds) {
      return error_at(line, "time budget exceeded (max_seconds=" + format_float(budget_.max_seconds) + ")");
    }
    return {};
  }

  Error budget_error() const {
    return make_error("output budget exceeded (max_output_bytes=" + std::to_string(budget_.max_output_bytes) + ")");
  }

  Status check_size(size_t bytes, int line) const {
    if (bytes > budget_.max_output_bytes) return error_at(line, budget_error().message);
    return {};
  }

  Status write(const std::string& s, int line) {
    bytes_written_ += s.size();
    TROUPE_TRY(check_size(bytes_written_, line));
    out_ += s;
    return check_time(line);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  Status assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return {};
    }
    if (!v.is_list() || v.list->size() != targets.size()) {
      return error_at(
          line, "cannot unpack " + std::string(type_name(v)) + " into " + std::to_string(targets.size()) + " names");
    }
    for (size_t k = 0; k < targets.size(); ++k) scopes_.back()[targets[k]] = (*v.list)[k];
    return {};
  }

  Status exec_body(const Body& body, Flow* flow) {
    for (const Stmt& s : body) {
      TROUPE_TRY(exec(s, flow));
      if (*flow != Flow::kNormal) return {};
    }
    return {};
  }

  Status exec(const Stmt& s, Flow* flow) {
    DepthGuard guard(&depth_);
    TROUPE_TRY(check_depth(s.line));
    switch (s.kind) {
      case StmtKind::kText:
        return write(s.text, s.line);
      case StmtKind::kOutput: {
        JINJA_EVAL(v, eval(*s.expr));
        auto text = to_str(v, budget_.max_depth);
        if (!text.ok()) return error_at(s.line, text.error().message);
        return write(text.value(), s.line);
      }
      case StmtKind::kIf: {
        for (size_t k = 0; k < s.bodies.size(); ++k) {
          if (k < s.conds.size()) {
            JINJA_EVAL(cond, eval(*s.conds[k]));
            if (!truthy(cond)) continue;
          }
          return exec_body(s.bodies[k], flow);
        }
        return {};
      }
      case StmtKind::kFor:
        return exec_for(s);
      case StmtKind::kSet: {
        JINJA_EVAL(v, eval(*s.expr));
        if (s.attr.empty()) return assign(s.targets, v, s.line);
        TROUPE_TRY(check_nesting(v, s.line));
        Value ns = lookup(s.targets[0]);
        if (ns.kind != Kind::kNamespace) {
          return error_at(s.line,
                          "cannot assign attribute '" + s.attr + "' on '" + s.targets[0] + "': not a namespace");
        }
        ns.dict->set(s.attr, std::move(v));
        return {};
      }
      case StmtKind::kSetBlock: {
        std::string saved;
        std::swap(saved, out_);
        Status st = exec_body(s.bodies[0], flow);
        std::swap(saved, out_);
        if (!st.ok()) return st;
        return assign(s.targets, Value::string(std::move(saved)), s.line);
      }
      case StmtKind::kBreak:
        *flow = Flow::kBreak;
        return {};
      case StmtKind::kContinue:
        *flow = Flow::kContinue;
        return {};
      case StmtKind::kBlock:
        return exec_body(s.bodies[0], flow);
    }
    return {};
  }

  Status exec_for(const Stmt& s) {
    JINJA_EVAL(iterable, eval(*s.expr));
    auto items_r = iterate(iterable);
    if (!items_r.ok()) return error_at(s.line, items_r.error().message);
    ValueList items = std::move(items_r.value());
    if (s.filter) {
      ValueList kept;
      for (const Value& item : items) {
        TROUPE_TRY(count_iteration(s.line));
        scopes_.emplace_back();
        Status st = assign(s.targets, item, s.line);
        Result<Value> keep = st.ok() ? eval(*s.filter) : Result<Value>(st.error());
        scopes_.pop_back();
        if (!keep.ok()) return keep.error();
        if (truthy(keep.value())) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() < 2) return {};
      Flow flow = Flow::kNormal;
      return exec_body(s.bodies[1], &flow);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      TROUPE_TRY(count_iteration(s.line));
      ValueDict loop;
      loop.entries.reserve(9);
      loop.entries.emplace_back("index", Value::integer(k + 1));
      loop.entries.emplace_back("index0", Value::integer(k));
      loop.entries.emplace_back("revindex", Value::integer(n - k));
      loop.entries.emplace_back("revindex0", Value::integer(n - k - 1));
      loop.entries.emplace_back("first", Value::boolean(k == 0));
      loop.entries.emplace_back("last", Value::boolean(k == n - 1));
      loop.entries.emplace_back("length", Value::integer(n));
      if (k > 0) loop.entries.emplace_back("previtem", items[k - 1]);
      if (k + 1 < n) loop.entries.emplace_back("nextitem", items[k + 1]);
      Value loop_value = Value::make_dict(std::move(loop));
      TROUPE_TRY(check_nesting(loop_value, s.line));
      scopes_.emplace_back();
      scopes_.back()["loop"] = std::move(loop_value);
      Flow flow = Flow::kNormal;
      Status st = assign(s.targets, items[k], s.line);
      if (st.ok()) st = exec_body(s.bodies[0], &flow);
      scopes_.pop_back();
      if (!st.ok()) return st;
      if (flow == Flow::kBreak) break;
    }
    return {};
  }

  Status count_iteration(int line) {
    if (++iterations_ > budget_.max_loop_iterations) {
      return error_at(line,
                      "loop budget exceeded (max_loop_iterations=" + std::to_string(budget_.max_loop_iterations) + ")");
    }
    return check_time(line);
  }

  Result<CallArgs> eval_args(const Expr& e, size_t first) {
    CallArgs args;
    args.max_depth = budget_.max_depth;
    for (size_t k = first; k < e.args.size(); ++k) {
      JINJA_EVAL(v, eval(*e.args[k]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [name, expr] : e.kwargs) {
      JINJA_EVAL(v, eval(*expr));
      args.keyword.emplace_back(name, std::move(v));
    }
    return args;
  }

  // Wraps a builtin's plain error with the expression's line.
  static Result<Value> at_line(Result<Value> r, int line) {
    if (!r.ok()) return error_at(line, r.error().message);
    return r;
  }

  // Every value an expression makes (a list literal, a filter's or call's result, ...) is
  // checked, so no value gets more than one level past max_depth, however a loop nests it.
  Result<Value> eval(const Expr& e) {
    auto v = eval_expr(e);
    if (v.ok()) TROUPE_TRY(check_nesting(v.value(), e.line));
    return v;
  }

  Result<Value> eval_expr(const Expr& e) {
    DepthGuard guard(&depth_);
    TROUPE_TRY(check_depth(e.line));
    if (++evals_ % 1024 == 0) TROUPE_TRY(check_time(e.line));
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.value;
      case ExprKind::kName:
        return lookup(e.name);
      case ExprKind::kList: {
        ValueList items;
        for (const auto& a : e.args) {
          JINJA_EVAL(v, eval(*a));
          items.push_back(std::move(v));
        }
        return Value::make_list(std::move(items), e.is_tuple);
      }
      case ExprKind::kDict: {
        ValueDict d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          JINJA_EVAL(key, eval(*e.args[k]));
          if (!key.is_string())
            return error_at(e.line, "unsupported dict key type '" + std::string(type_name(key)) + "'");
          JINJA_EVAL(v, eval(*e.args[k + 1]));
          d.set(key.s, std::move(v));
        }
        return Value::make_dict(std::move(d));
      }
      case ExprKind::kGetAttr: {
        JINJA_EVAL(obj, eval(*e.args[0]));
        return at_line(get_attr(obj, e.name), e.line);
      }
      case ExprKind::kGetItem: {
        JINJA_EVAL(obj, eval(*e.args[0]));
        JINJA_EVAL(key, eval(*e.args[1]));
        return at_line(get_item(obj, key), e.line);
      }
      case ExprKind::kSlice: {
        JINJA_EVAL(obj, eval(*e.args[0]));
        Value bounds[3];
        for (int k = 0; k < 3; ++k) {
          bounds[k] = Value::none();
          if (e.args[k + 1]) {
            JINJA_EVAL(b, eval(*e.args[k + 1]));
            bounds[k] = std::move(b);
          }
        }
        return at_line(get_slice(obj, bounds[0], bounds[1], bounds[2]), e.line);
      }
      case ExprKind::kCall:
        return eval_call(e);
      case ExprKind::kFilter: {
        JINJA_EVAL(subject, eval(*e.args[0]));
        auto args = eval_args(e, 1);
        if (!args.ok()) return args.error();
        JINJA_EVAL(v, at_line(apply_filter(e.name, subject, args.value()), e.line));
        TROUPE_TRY(check_value_size(v, e.line));
        return v;
      }
      case ExprKind::kTest: {
        JINJA_EVAL(subject, eval(*e.args[0]));
        auto args = eval_args(e, 1);
        if (!args.ok()) return args.error();
        auto r = apply_test(e.name, subject, args.value());
        if (!r.ok()) return error_at(e.line, r.error().message);
        return Value::boolean(r.value() != e.negated);
      }
      case ExprKind::kUnary: {
        JINJA_EVAL(v, eval(*e.args[0]));
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (!v.is_number())
          return error_at(e.line, "bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
        if (e.name == "+") return v.kind == Kind::kBool ? Value::integer(v.b) : v;
        if (v.kind == Kind::kFloat) return Value::real(-v.f);
        if (int_of(v) == INT64_MIN) return error_at(e.line, "integer overflow");
        return Value::integer(-int_of(v));
      }
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        JINJA_EVAL(lhs, eval(*e.args[0]));
        if (truthy(lhs) == (e.kind == ExprKind::kOr)) return lhs;
        return eval(*e.args[1]);
      }
      case ExprKind::kCondExpr: {
        JINJA_EVAL(cond, eval(*e.args[1]));
        if (truthy(cond)) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
      case ExprKind::kBinary: {
        JINJA_EVAL(lhs, eval(*e.args[0]));
        JINJA_EVAL(rhs, eval(*e.args[1]));
        JINJA_EVAL(v, at_line(binary(e.name, lhs, rhs), e.line));
        TROUPE_TRY(check_value_size(v, e.line));
        return v;
      }
    }
    return error_at(e.line, "unknown expression");
  }

  // Strings and lists built on the way to the output are bounded by the output budget.
  Status check_value_size(const Value& v, int line) const {
    if (v.is_string()) return check_size(v.s.size(), line);
    if (v.is_list()) return check_size(v.list->size(), line);
    return {};
  }

  Result<Value> binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") {
      auto x = to_str(a, budget_.max_depth);
      if (!x.ok()) return x.error();
      auto y = to_str(b, budget_.max_depth);
      if (!y.ok()) return y.error();
      return Value::string(x.value() + y.value());
    }
    if (op == "==") return Value::boolean(equals(a, b));
    if (op == "!=") return Value::boolean(!equals(a, b));
    if (op == "in" || op == "not in") {
      auto r = contains(b, a);
      if (!r.ok()) return r.error();
      return Value::boolean(r.value() == (op == "in"));
    }
    if (a.is_undefined() || b.is_undefined()) return make_error((a.is_undefined() ? a : b).s);
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      auto c = compare(a, b, op);
      if (!c.ok()) return c.error();
      int x = c.value();
      return Value::boolean(op == "<" ? x < 0 : op == ">" ? x > 0 : op == "<=" ? x <= 0 : x >= 0);
    }
    if (op == "+" && a.is_string() && b.is_string()) {
      if (a.s.size() + b.s.size() > budget_.max_output_bytes) return budget_error();
      return Value::string(a.s + b.s);
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      ValueList items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(items), a.is_tuple && b.is_tuple);
    }
    if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
      const Value& seq = a.is_string() || a.is_list() ? a : b;
      const Value& times = &seq == &a ? b : a;
      if (times.kind != Kind::kInt && times.kind != Kind::kBool) return make_error(op_error(op, a, b));
      int64_t n = std::max<int64_t>(0, int_of(times));
      size_t unit = seq.is_string() ? seq.s.size() : seq.list->size();
      if (unit == 0) n = 0;  // (empty either way: not n passes over nothing, 10**10 of them)
      if (unit && static_cast<uint64_t>(n) > budget_.max_output_bytes / unit) return budget_error();
      if (seq.is_string()) {
        std::string out;
        for (int64_t k = 0; k < n; ++k) out += seq.s;
        return Value::string(std::move(out));
      }
      ValueList items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq.list->begin(), seq.list->end());
      return Value::make_list(std::move(items), seq.is_tuple);
    }
    if (op == "%" && a.is_string()) return make_error("unsupported construct: '%' string formatting");
    return arithmetic(op, a, b);
  }

  Result<Value> eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    auto args = eval_args(e, 1);
    if (!args.ok()) return args.error();
    if (callee.kind == ExprKind::kName) {
      JINJA_EVAL(v, at_line(call_function(callee.name, args.value(), budget_.max_loop_iterations), e.line));
      if (v.kind == Kind::kNamespace) track_namespace(v);
      return v;
    }
    JINJA_EVAL(obj, eval(*callee.args[0]));
    JINJA_EVAL(v, at_line(call_method(obj, callee.name, args.value()), e.line));
    TROUPE_TRY(check_value_size(v, e.line));
    return v;
  }

  // Remembered (weakly) for the destructor; dead entries are dropped as the list doubles.
  void track_namespace(const Value& ns) {
    if (namespaces_.size() >= namespaces_prune_at_) {
      namespaces_.erase(
          std::remove_if(namespaces_.begin(), namespaces_.end(), [](const auto& w) { return w.expired(); }),
          namespaces_.end());
      namespaces_prune_at_ = std::max<size_t>(64, namespaces_.size() * 2);
    }
    namespaces_.push_back(ns.dict);
  }

  const TemplateBudget& budget_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<std::weak_ptr<ValueDict>> namespaces_;
  size_t namespaces_prune_at_ = 64;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
  uint64_t bytes_written_ = 0;
  uint64_t iterations_ = 0;
  uint64_t evals_ = 0;
  uint32_t depth_ = 0;
};

}  // namespace

Result<std::string> render(const Body& body, const ValueDict& vars, const TemplateBudget& budget) {
  return Renderer(vars, budget).run(body);
}

}  // namespace troupe::jinja
