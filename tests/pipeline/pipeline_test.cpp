// Agent pipelines (issue 36): the spec's checks, templates, tools and the node-by-node
// runner over a scripted generator (the engine-backed run is the cli test's).
#include <catch2/catch.hpp>

#include "runtime/pipeline/pipeline_runner.h"
#include "runtime/pipeline/tools.h"

using namespace troupe;
using nlohmann::json;

namespace {

std::string error_of(const json& j, const PipelineLimits& lim = {}) {
  auto r = parse_pipeline(j, lim);
  return r ? std::string() : r.error().message;
}

json gen(const std::string& id, const std::string& prompt) {
  return {{"id", id}, {"type", "generate"}, {"prompt", prompt}, {"max_tokens", 8}};
}

}  // namespace

TEST_CASE("pipeline spec: templates, order and the run's inputs", "[pipeline]") {
  auto refs = template_refs("Q: {{input.q}} A: {{ a }} {{b}}");
  REQUIRE(refs.ok());
  CHECK(*refs == std::vector<std::string>{"input.q", "a", "b"});
  CHECK_FALSE(template_refs("{{a").ok());
  CHECK_FALSE(template_refs("{{}}").ok());
  CHECK_FALSE(template_refs("{{a b}}").ok());
  CHECK_FALSE(template_refs("{{other.x}}").ok());
  // Nodes listed after what reads them are reordered; the last in order is the output.
  json spec = {{"name", "t"},
               {"nodes", json::array({gen("b", "B {{a}}"), gen("a", "A {{input.topic}}"), gen("c", "{{a}} {{b}}")})}};
  auto s = parse_pipeline(spec);
  REQUIRE(s.ok());
  REQUIRE(s->nodes.size() == 3);
  CHECK(s->nodes[0].id == "a");
  CHECK(s->nodes[1].id == "b");
  CHECK(s->nodes[2].id == "c");
  CHECK(s->nodes[2].deps == std::vector<std::string>{"a", "b"});
  CHECK(s->inputs == std::vector<std::string>{"topic"});
  CHECK(s->output == "c");
}

TEST_CASE("pipeline spec: bad specs are refused with a message naming the node", "[pipeline]") {
  auto with = [](json nodes) { return json{{"name", "t"}, {"nodes", nodes}}; };
  struct Case {
    json spec;
    std::string words;
  };
  PipelineLimits lim;
  lim.max_fanout = 8;
  const std::vector<Case> cases = {
      {json::array(), "a JSON object"},
      {json{{"name", "t"}}, "'nodes'"},
      {json{{"name", "bad name"}, {"nodes", json::array({gen("a", "x")})}}, "'name'"},
      {with(json::array({gen("a", "{{b}}"), gen("b", "{{a}}")})), "is on a cycle"},
      {with(json::array({gen("a", "{{a}}")})), "node 'a': reads its own output"},
      {with(json::array({gen("a", "{{nope}}")})), "node 'a': references 'nope', which is no node"},
      {with(json::array({gen("a", "x"), gen("a", "y")})), "node 'a': the id is used twice"},
      {with(json::array({json{{"id", "f"}, {"type", "fork"}, {"prompt", "x"}, {"n", 9}}})),
       "node 'f': 'n' must be 1..8"},
      {with(json::array({json{{"id", "l"}, {"type", "loop"}}})), "loop nodes are not built yet"},
      {with(json::array({json{{"id", "t"}, {"type", "tool"}, {"tool", "shell"}, {"input", "ls"}}})),
       "node 't': tool 'shell' is not allowed"},
      {with(json::array({json{{"id", "t"}, {"type", "tool"}, {"tool", "regex_extract"}, {"input", "x"}}})),
       "needs a 'pattern'"},
      {with(json::array({json{{"id", "g"}, {"type", "generate"}, {"prompt", "x"}, {"max_tokens", 100000}}})),
       "node 'g': 'max_tokens'"},
      {with(json::array({json{{"id", "g"}, {"type", "generate"}, {"prompt", "x"}, {"temprature", 1}}})),
       "node 'g': unknown field 'temprature'"},
      {with(json::array({gen("g", "{{item}}")})), "only known inside a map"},
      {with(json::array({json{{"id", "j"}, {"type", "join"}, {"from", "g"}, {"mode", "judge"}}, gen("g", "x")})),
       "'mode' must be"},
      {json{{"name", "t"}, {"budget_tokens", 10000000}, {"nodes", json::array({gen("a", "x")})}}, "'budget_tokens'"},
  };
  for (const auto& c : cases) {
    INFO(c.spec.dump());
    const std::string e = error_of(c.spec, lim);
    INFO(e);
    CHECK(e.find(c.words) != std::string::npos);
  }
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back(gen("n" + std::to_string(i), "x"));
  CHECK(error_of(with(many)).find("65 nodes (limit 64)") != std::string::npos);
}

TEST_CASE("pipeline tools: calculator, regex and JSON extraction, bounded", "[pipeline]") {
  auto calc = [](const std::string& s) {
    auto v = calculate(s);
    REQUIRE(v.ok());
    return *v;
  };
  CHECK(calc("1 + 2 * 3") == 7);
  CHECK(calc("(1 + 2) * 3") == 9);
  CHECK(calc("2 ^ 3 ^ 2") == 512);  // right-associative
  CHECK(calc("-4 + 10 % 4") == -2);
  CHECK(calc("7 / 2") == 3.5);
  const std::string deep = std::string(40, '(') + "1" + std::string(40, ')');
  for (const std::string& bad : {std::string("1 / 0"), std::string("2 +"), std::string("(1"), std::string("1.2.3"),
                                 std::string("1 $ 2"), std::string(), deep}) {
    INFO(bad);
    CHECK_FALSE(calculate(bad).ok());
  }
  CHECK_FALSE(calculate(std::string(300, '1')).ok());
  CHECK(format_number(42) == "42");
  CHECK(format_number(0.5) == "0.5");
  CHECK(format_number(1.0 / 3) == "0.333333333333");
  // In free text: the first expression that parses.
  auto t = run_tool("calculator", "The answer is 12 * (3 + 4), I think.", "");
  REQUIRE(t.ok());
  CHECK(*t == "84");
  CHECK_FALSE(run_tool("calculator", "no numbers here", "").ok());
  auto most = run_tool("calculator", "He has 12 cows and buys 7, so 12 + 7 = ", "");
  REQUIRE(most.ok());
  CHECK(*most == "19");
  auto r = run_tool("regex_extract", "Answer: 17 apples", "Answer:\\s*(\\d+)");
  REQUIRE(r.ok());
  CHECK(*r == "17");
  CHECK_FALSE(run_tool("regex_extract", "x", "(").ok());
  // A catastrophic pattern hits PCRE2's match limit instead of hanging.
  auto slow = run_tool("regex_extract", std::string(40, 'a') + "b", "^(a+)+$");
  REQUIRE_FALSE(slow.ok());
  CHECK(slow.error().message.find("match limit") != std::string::npos);
  auto j = run_tool("json_extract", "Sure! {\"city\": \"Paris\", \"n\": {\"x\": 1}} done", "n");
  REQUIRE(j.ok());
  CHECK(*j == "{\"x\":1}");
  auto js = run_tool("json_extract", "{\"city\": \"Pa}ris\"}", "city");
  REQUIRE(js.ok());
  CHECK(*js == "Pa}ris");
  CHECK_FALSE(run_tool("json_extract", "{\"a\": 1}", "b").ok());
  CHECK_FALSE(run_tool("json_extract", "no object", "b").ok());
}

TEST_CASE("pipeline runner: every node kind over a scripted generator, budgets and errors", "[pipeline]") {
  // The scripted generator answers "<node>:<branch>" unless told otherwise, and counts calls.
  std::vector<GenerateCall> calls;
  std::map<std::string, std::vector<std::string>> script;
  GenerateFn fake = [&](const GenerateCall& c) -> Result<GenerateResult> {
    calls.push_back(c);
    GenerateResult r;
    for (int32_t i = 0; i < c.n; ++i) {
      auto it = script.find(c.node);
      r.texts.push_back(it != script.end() ? it->second[(calls.size() + i - 1) % it->second.size()]
                                           : c.node + ":" + std::to_string(i));
    }
    r.prompt_tokens = 10;
    r.completion_tokens = c.max_tokens * c.n;
    return r;
  };
  json spec = {
      {"name", "all"},
      {"budget_tokens", 200},
      {"nodes",
       json::array({
           {{"id", "list"}, {"type", "generate"}, {"prompt", "List {{input.n}} fruits"}, {"max_tokens", 10}},
           {{"id", "each"}, {"type", "map"}, {"over", "list"}, {"prompt", "Describe {{item}}"}, {"max_tokens", 5}},
           {{"id", "votes"},
            {"type", "fork"},
            {"n", 5},
            {"prompt", "{{each}} -- 2+2?"},
            {"max_tokens", 4},
            {"temperature", 0.8},
            {"seed", 3}},
           {{"id", "answer"}, {"type", "join"}, {"from", "votes"}, {"mode", "vote"}},
           {{"id", "check"}, {"type", "tool"}, {"tool", "calculator"}, {"input", "{{answer}} * 10"}},
           {{"id", "all"}, {"type", "join"}, {"from", "each"}},
       })},
      {"output", "check"}};
  auto s = parse_pipeline(spec);
  REQUIRE(s.ok());
  script["list"] = {"apple\npear\n\nplum"};
  script["votes"] = {"4", "5", " 4.", "4", "22"};
  std::vector<json> events;
  auto run = run_pipeline(*s, {{"n", "3"}}, fake, [&](const json& e) { events.push_back(e); });
  REQUIRE(run.ok());
  REQUIRE(calls.size() == 5);  // list, 3 map items, one fork call of 5
  CHECK(calls[0].prompt == "List 3 fruits");
  CHECK(calls[1].prompt == "Describe apple");
  CHECK(calls[3].prompt == "Describe plum");
  CHECK(calls[4].n == 5);
  CHECK(calls[4].prompt == "each:0\neach:0\neach:0 -- 2+2?");
  CHECK(calls[4].temperature == 0.8);
  CHECK(run->outputs.at("answer") == std::vector<std::string>{"4"});
  CHECK(run->output == "40");
  CHECK(run->outputs.at("all")[0] == "each:0\neach:0\neach:0");
  CHECK(run->completion_tokens == 10 + 3 * 5 + 5 * 4);
  CHECK(events.front()["event"] == "node_started");
  CHECK(events.back()["event"] == "finished");
  CHECK(std::count_if(events.begin(), events.end(), [](const json& e) { return e["event"] == "tool_result"; }) == 1);
  // Missing inputs, a spent budget and a failing tool each end the run with a typed error.
  calls.clear();
  CHECK_FALSE(run_pipeline(*s, {}, fake).ok());
  CHECK(calls.empty());
  json tight = spec;
  tight["budget_tokens"] = 30;  // list takes 10, the map 15, the fork's 5 branches find 5 left: 1 each
  auto t = parse_pipeline(tight);
  REQUIRE(t.ok());
  calls.clear();
  REQUIRE(run_pipeline(*t, {{"n", "3"}}, fake).ok());
  CHECK(calls.back().max_tokens == 1);
  tight["budget_tokens"] = 27;  // 2 left for 5 branches
  t = parse_pipeline(tight);
  REQUIRE(t.ok());
  events.clear();
  auto spent = run_pipeline(*t, {{"n", "3"}}, fake, [&](const json& e) { events.push_back(e); });
  REQUIRE_FALSE(spent.ok());
  CHECK(spent.error().message.find("node 'votes': the run's token budget of 27 is spent") != std::string::npos);
  CHECK(events.back()["event"] == "error");
  CHECK(events.back()["node"] == "votes");
  script["votes"] = {"no number"};
  auto bad_tool = run_pipeline(*s, {{"n", "3"}}, fake);
  REQUIRE_FALSE(bad_tool.ok());
  CHECK(bad_tool.error().message.find("node 'check': calculator") != std::string::npos);
  // A map over more items than the fan-out limit.
  script["list"] = {std::string(40, 'x') + "\n" + "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\nm\nn\no\np\nq"};
  auto wide = run_pipeline(*s, {{"n", "3"}}, fake);
  REQUIRE_FALSE(wide.ok());
  CHECK(wide.error().message.find("node 'each': 'list' gives 18 items (limit 16)") != std::string::npos);
  CHECK(majority_vote({"A", "b", "a ", "B", "c"}) == "A");
}
