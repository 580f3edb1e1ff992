// ChatTemplate against jinja2 configured like transformers (tests/golden/chat_template,
// made by make_golden.py), plus budgets, parse errors and raise_exception.
#include <catch2/catch.hpp>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/chat/chat_template.h"

#ifndef TROUPE_SOURCE_DIR
#error "TROUPE_SOURCE_DIR must name the repository root"
#endif

using troupe::ChatMessage;
using troupe::ChatTemplate;
using troupe::TemplateBudget;

namespace {

const std::string kGoldenDir = std::string(TROUPE_SOURCE_DIR) + "/tests/golden/chat_template/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatTemplate must_parse(const std::string& source) {
  auto t = ChatTemplate::parse(source);
  INFO((t.ok() ? std::string() : t.error().message));
  REQUIRE(t.ok());
  return t.value();
}

std::string render_ok(const ChatTemplate& t, const nlohmann::ordered_json& vars, const TemplateBudget& budget = {}) {
  auto r = t.render_json(vars, budget);
  INFO((r.ok() ? std::string() : r.error().message));
  REQUIRE(r.ok());
  return r.value();
}

std::string render_error(const ChatTemplate& t, const nlohmann::ordered_json& vars, const TemplateBudget& budget = {}) {
  auto r = t.render_json(vars, budget);
  INFO((r.ok() ? "unexpected output: " + r.value() : ""));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

std::string parse_error(const std::string& source) {
  auto t = ChatTemplate::parse(source);
  REQUIRE_FALSE(t.ok());
  return t.error().message;
}

}  // namespace

TEST_CASE("chat template golden cases match jinja2", "[chat_template]") {
  auto cases = nlohmann::ordered_json::parse(read_file(kGoldenDir + "cases.json"));
  REQUIRE(cases.size() >= 100);
  std::map<std::string, ChatTemplate> templates;
  size_t num_rendered = 0, num_errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    INFO("case " << name);
    // A case names a template file or carries its source inline (the snippets).
    const bool inline_source = c.contains("source");
    const std::string key = inline_source ? c["source"].get<std::string>() : c["template"].get<std::string>();
    if (!templates.count(key)) {
      templates.emplace(key, must_parse(inline_source ? key : read_file(kGoldenDir + "templates/" + key)));
    }
    const ChatTemplate& t = templates.at(key);
    const auto& vars = c["vars"];
    auto got = t.render_json(vars);
    // The same case through the typed entry point when it only needs role/content.
    if (c["uses_render"].get<bool>()) {
      std::vector<ChatMessage> messages;
      for (const auto& m : vars["messages"])
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      auto typed = t.render(messages, vars["add_generation_prompt"].get<bool>(), vars["bos_token"].get<std::string>(),
                            vars["eos_token"].get<std::string>());
      REQUIRE(typed.ok() == got.ok());
      if (typed.ok()) CHECK(typed.value() == got.value());
    }
    if (c.contains("expected")) {
      INFO((got.ok() ? std::string() : got.error().message));
      REQUIRE(got.ok());
      CHECK(got.value() == c["expected"].get<std::string>());
      ++num_rendered;
    } else {
      INFO((got.ok() ? "unexpected output: " + got.value() : ""));
      REQUIRE_FALSE(got.ok());
      const std::string expected_error = c["error"].get<std::string>();
      if (!expected_error.empty()) CHECK_THAT(got.error().message, Catch::Contains(expected_error));
      ++num_errors;
    }
  }
  CHECK(num_rendered > 100);
  CHECK(num_errors > 10);
}

TEST_CASE("chat template typed render of SmolLM2's template", "[chat_template]") {
  ChatTemplate t = must_parse(read_file(kGoldenDir + "templates/smollm2.jinja"));
  auto r = t.render({{"user", "Hi"}}, true, "", "");
  REQUIRE(r.ok());
  CHECK(r.value() ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("chat template raise_exception reports the template's message", "[chat_template]") {
  ChatTemplate t = must_parse(read_file(kGoldenDir + "templates/mistral_v0.1.jinja"));
  auto r = t.render({{"user", "a"}, {"user", "b"}}, false, "<s>", "</s>");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("Conversation roles must alternate user/assistant/user/assistant/..."));
  CHECK_THAT(r.error().message, Catch::StartsWith("chat template line 1: "));
  auto good = t.render({{"user", "a"}, {"assistant", "b"}}, false, "<s>", "</s>");
  REQUIRE(good.ok());
  CHECK(good.value() == "<s>[INST] a [/INST]b</s> ");
}

TEST_CASE("chat template parse errors name the construct and line", "[chat_template]") {
  CHECK(parse_error("hello\n{% if x %}\n{% macro m() %}{% endmacro %}{% endif %}") ==
        "chat template line 3: unsupported tag 'macro'");
  CHECK(parse_error("{% include 'x' %}") == "chat template line 1: unsupported tag 'include'");
  CHECK(parse_error("a\n\n{{ x | wordwrap }}") == "chat template line 3: unsupported filter 'wordwrap'");
  CHECK(parse_error("{{ x is callable }}") == "chat template line 1: unsupported test 'callable'");
  CHECK(parse_error("{{ cycler(1) }}") == "chat template line 1: unsupported function 'cycler'");
  CHECK(parse_error("{{ x.append(1) }}") == "chat template line 1: unsupported method 'append'");
  CHECK(parse_error("{% for x in y recursive %}{% endfor %}") ==
        "chat template line 1: unsupported for-loop modifier 'recursive'");
  CHECK_THAT(parse_error("{% if x %}no end"), Catch::Contains("expected 'elif' or 'else' or 'endif'"));
  CHECK_THAT(parse_error("{% endfor %}"), Catch::Contains("unexpected tag 'endfor'"));
  CHECK_THAT(parse_error("{{ 'open }}"), Catch::Contains("unterminated string"));
  CHECK_THAT(parse_error("{# never closed"), Catch::Contains("missing end of comment"));
  CHECK_THAT(parse_error("{{ (1 }}"), Catch::Contains("line 1"));
  // Deep nesting is refused by the parser rather than overflowing the stack.
  CHECK_THAT(parse_error("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}"),
             Catch::Contains("nested too deeply"));
  std::string chain = "{{ 1";
  for (int k = 0; k < 100000; ++k) chain += "+1";
  CHECK_THAT(parse_error(chain + " }}"), Catch::Contains("tag too long"));
}

TEST_CASE("chat template loop budget", "[chat_template]") {
  ChatTemplate t = must_parse("{% for i in range(1000) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}");
  TemplateBudget patient;  // the loop budget must trip first, even on a slow (sanitizer) build
  patient.max_seconds = 60;
  std::string err = render_error(t, {}, patient);
  CHECK_THAT(err, Catch::Contains("loop budget exceeded (max_loop_iterations=100000)"));
  TemplateBudget small;
  small.max_loop_iterations = 10;
  ChatTemplate ten = must_parse("{% for i in range(10) %}{{ i }}{% endfor %}");
  CHECK(render_ok(ten, {}, small) == "0123456789");
  ChatTemplate eleven = must_parse("{% for i in range(5) %}{{ i }}{% endfor %}{% for i in range(6) %}{% endfor %}");
  CHECK_THAT(render_error(eleven, {}, small), Catch::Contains("loop budget exceeded"));
  // range() itself refuses to build more items than the budget allows.
  CHECK_THAT(render_error(must_parse("{{ range(1000000000000) | length }}"), {}),
             Catch::Contains("loop budget exceeded"));
}

TEST_CASE("chat template output budget", "[chat_template]") {
  TemplateBudget budget;
  budget.max_output_bytes = 100;
  ChatTemplate t = must_parse("{% for i in range(50) %}abc{% endfor %}");
  CHECK_THAT(render_error(t, {}, budget), Catch::Contains("output budget exceeded (max_output_bytes=100)"));
  ChatTemplate fits = must_parse("{% for i in range(33) %}abc{% endfor %}");
  CHECK(render_ok(fits, {}, budget).size() == 99);
  // Intermediate values count too: no 1 GB string on the way to an error.
  CHECK_THAT(render_error(must_parse("{% set s = 'x' * 1000000000 %}"), {}), Catch::Contains("output budget exceeded"));
  CHECK_THAT(render_error(must_parse("{% set s = 'abcdefghij' * 11 %}"), {}, budget), Catch::Contains("output budget"));
  // An empty string or list times a huge count is empty at once, not 10**10 passes over
  // nothing (found by chat_template_fuzz as a 15 s timeout).
  CHECK(render_ok(must_parse("[{{ '' * 10**10 }}{{ ([] * 10**10) | length }}{{ 10**10 * '' }}]"), {}) == "[0]");
}

TEST_CASE("chat template depth and time budgets", "[chat_template]") {
  TemplateBudget budget;
  budget.max_depth = 8;
  std::string nested = "{{ " + std::string(20, '(') + "1" + std::string(20, ')') + " + 1 }}";
  CHECK(render_ok(must_parse(nested), {}) == "2");
  std::string deep = "{{ 1" + std::string(0, ' ');
  for (int k = 0; k < 20; ++k) deep += " + 1";
  deep += " }}";
  CHECK(render_ok(must_parse(deep), {}) == "21");
  CHECK_THAT(render_error(must_parse(deep), {}, budget), Catch::Contains("depth budget exceeded (max_depth=8)"));
  std::string ifs;
  for (int k = 0; k < 10; ++k) ifs += "{% if true %}";
  ifs += "x";
  for (int k = 0; k < 10; ++k) ifs += "{% endif %}";
  CHECK(render_ok(must_parse(ifs), {}) == "x");
  CHECK_THAT(render_error(must_parse(ifs), {}, budget), Catch::Contains("depth budget exceeded"));

  TemplateBudget quick;
  quick.max_seconds = 0.05;
  quick.max_loop_iterations = uint64_t{1} << 40;
  ChatTemplate slow = must_parse(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% if i == j and i < 0 %}x{% endif %}{% endfor %}{% "
      "endfor %}");
  auto start = std::chrono::steady_clock::now();
  CHECK_THAT(render_error(slow, {}, quick), Catch::Contains("time budget exceeded (max_seconds=0.05)"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
}

TEST_CASE("chat template value nesting is bounded by max_depth", "[chat_template]") {
  // One level per loop iteration: str/tojson/== and freeing used to recurse once per level
  // and overflow the stack (about 50,000 levels). Building the 65th level is the error now.
  const std::string grow = "{% set ns = namespace(x=[], d={}) %}{% for i in range(99000) %}";
  const std::string limit = "value nested deeper than 64 levels (max_depth=64)";
  CHECK_THAT(render_error(must_parse(grow + "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson }}"), {}),
             Catch::Contains("line 1: " + limit));
  CHECK_THAT(render_error(must_parse(grow + "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"), {}),
             Catch::Contains(limit));
  CHECK_THAT(render_error(must_parse(grow + "{% set ns.d = {'a': ns.d} %}{% endfor %}{{ ns.d | string }}"), {}),
             Catch::Contains(limit));
  CHECK_THAT(render_error(must_parse(grow + "{% set ns.d = dict(a=ns.d) %}{% endfor %}"), {}), Catch::Contains(limit));
  CHECK_THAT(render_error(must_parse(grow + "{% set ns.d = {'a': ns.d}.items() %}{% endfor %}"), {}),
             Catch::Contains(limit));
  CHECK_THAT(render_error(must_parse(grow + "{% set ns.x = [ns.x] | list %}{% endfor %}"), {}), Catch::Contains(limit));
  // Exactly max_depth levels still render; the limit follows the budget.
  ChatTemplate to64 = must_parse(
      "{% set ns = namespace(x=1) %}{% for i in range(n) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson }}");
  CHECK(render_ok(to64, {{"n", 64}}) == std::string(64, '[') + "1" + std::string(64, ']'));
  CHECK_THAT(render_error(to64, {{"n", 65}}), Catch::Contains(limit));
  TemplateBudget shallow;
  shallow.max_depth = 30;
  CHECK(render_ok(to64, {{"n", 30}}, shallow).size() == 61);
  CHECK_THAT(render_error(to64, {{"n", 31}}, shallow),
             Catch::Contains("value nested deeper than 30 levels (max_depth=30)"));
  // Template variables are held to the same limit, before any recursion over them.
  nlohmann::ordered_json deep = 1;
  for (int k = 0; k < 100000; ++k) deep = nlohmann::ordered_json::array({std::move(deep)});
  nlohmann::ordered_json vars;
  vars["v"] = std::move(deep);  // moved, not copied: nlohmann copies recursively
  CHECK_THAT(render_error(must_parse("{{ v }}"), vars), Catch::Contains("chat template variable 'v': " + limit));
  // A chain of namespaces, each holding the next, as long as the loop budget allows:
  // freeing it must not recurse either. A namespace holding itself is freed too.
  CHECK(render_ok(must_parse("{% set st = namespace(tail=namespace(next=none)) %}{% set head = st.tail %}"
                             "{% for i in range(99000) %}{% set t = st.tail %}{% set n = namespace(next=none) %}"
                             "{% set t.next = n %}{% set st.tail = n %}{% endfor %}"
                             "{% set ns = namespace() %}{% set ns.self = [ns] %}ok"),
                  {}) == "ok");
}

TEST_CASE("chat template renders normally nested values", "[chat_template]") {
  auto out = [](const std::string& src, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
    return render_ok(must_parse(src), vars);
  };
  const std::string three = "{% set v = [{'a': [1, 'x']}, (2,)] %}";
  CHECK(out(three + "{{ v }}") == "[{'a': [1, 'x']}, (2,)]");
  CHECK(out(three + "{{ v | tojson }}") == "[{\"a\": [1, \"x\"]}, [2]]");
  CHECK(out(three + "{{ v | string }}|{{ v == v }}|{{ v[0].a[1] }}") == "[{'a': [1, 'x']}, (2,)]|True|x");
  CHECK(out("{% set ns = namespace(x=[]) %}{% for i in range(3) %}{% set ns.x = [ns.x, i] %}{% endfor %}{{ ns.x }}") ==
        "[[[[], 0], 1], 2]");
  CHECK(out("{{ v | tojson(indent=2) }}", {{"v", {{"a", {1, {{"b", nullptr}}}}}}}) ==
        "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}");
}

TEST_CASE("chat template Jinja semantics", "[chat_template]") {
  auto out = [](const std::string& src, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
    return render_ok(must_parse(src), vars);
  };
  // Undefined is empty and falsy; attribute access on it is an error (as in Jinja).
  CHECK(out("[{{ nope }}]{% if nope %}x{% else %}y{% endif %}") == "[]y");
  CHECK_THAT(render_error(must_parse("{{ nope.attr }}"), {}), Catch::Contains("'nope' is undefined"));
  // Loop-body sets do not leak; namespaces do.
  CHECK(out("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
  CHECK(out("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}") == "2");
  // trim_blocks / lstrip_blocks / explicit whitespace control / trailing newline.
  CHECK(out("a\n  {% if true %}\n  b\n  {% endif %}\nc\n") == "a\n  b\nc");
  CHECK(out("a  {{- 'b' -}}  c") == "abc");
  CHECK(out("a\n  {%+ if true %}b{% endif %}") == "a\n  b");
  CHECK(out("x {# note #}\ny") == "x y");
  CHECK(out("{% generation %}gen {{ 1 }}{% endgeneration %}") == "gen 1");  // transformers' AssistantTracker tag
  CHECK(out("{{ 'a' }}\n{{ 'b' }}") == "a\nb");
  // Filters bind tighter than operators.
  CHECK(out("{{ 'a' + ' b ' | trim + 'c' }}") == "abc");
  CHECK(out("{{ not x is defined }}") == "True");
  // tojson keeps key order, non-ASCII text and Python's separators.
  CHECK(out("{{ v | tojson }}", {{"v", {{"z", 1}, {"a", "é"}}}}) == "{\"z\": 1, \"a\": \"é\"}");
  CHECK(out("{{ v | tojson(ensure_ascii=true) }}", {{"v", "é😀"}}) == "\"\\u00e9\\ud83d\\ude00\"");
  // strftime_now formats local time.
  char year[8];
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(year, sizeof(year), "%Y", &local);
  CHECK(out("{{ strftime_now('%Y') }}") == year);
  // Variables from a sorted nlohmann::json work too.
  auto t = must_parse("{{ messages[0].content }}|{{ flag }}");
  auto r = t.render_json(nlohmann::json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"flag", true}});
  REQUIRE(r.ok());
  CHECK(r.value() == "hi|True");
}
