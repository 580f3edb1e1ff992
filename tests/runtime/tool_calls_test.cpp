// Tool calling (runtime/chat/tool_calls.h): the three output formats parse into calls, text
// that is not a call stays content, the streaming hold-back stops before a marker, and the
// forced-call grammar takes exactly the calls whose arguments match the function's schema.
#include "runtime/chat/tool_calls.h"

#include <catch2/catch.hpp>

#include "runtime/grammar/grammar.h"

using namespace troupe;
using ojson = nlohmann::ordered_json;

namespace {

std::vector<ToolFunction> weather_tools() {
  ToolFunction w{"get_weather", "Weather in a city",
                 ojson::parse(R"({"type":"object","properties":{"city":{"type":"string"},
                   "unit":{"enum":["c","f"]}},"required":["city"],"additionalProperties":false})")};
  ToolFunction t{"get_time", "", ojson::parse(R"({"type":"object","properties":{"tz":{"type":"string"}},
                   "required":["tz"],"additionalProperties":false})")};
  return {w, t};
}

bool matches(const std::string& grammar, const std::string& text) {
  auto g = Grammar::compile(grammar);
  if (!g) FAIL(g.error().message);
  GrammarState st(**g);
  return st.feed(text) && st.accepting();
}

}  // namespace

TEST_CASE("tool calls parse from the Hermes, SmolLM2 list, Mistral and Llama-3 formats", "[tools]") {
  const auto tools = weather_tools();
  auto p = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
      tools);
  REQUIRE(p.calls.size() == 2);
  CHECK(p.content == "Let me check.");
  CHECK(p.calls[0].name == "get_weather");
  CHECK(ojson::parse(p.calls[0].arguments) == ojson{{"city", "Paris"}});
  CHECK(p.calls[1].name == "get_time");

  p = parse_tool_calls(
      R"(<tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]</tool_call>)",
      tools);
  REQUIRE(p.calls.size() == 2);
  CHECK(p.content.empty());

  p = parse_tool_calls(R"([TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}}])", tools);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].name == "get_time");

  p = parse_tool_calls(R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}})", tools);
  REQUIRE(p.calls.size() == 1);
  CHECK(ojson::parse(p.calls[0].arguments)["city"] == "Oslo");
  p = parse_tool_calls(R"( {"name": "get_time", "parameters": {"tz": "EST"}} )", tools);
  REQUIRE(p.calls.size() == 1);

  p = parse_tool_calls(R"(<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}</tool_call>)", tools);
  REQUIRE(p.calls.size() == 1);  // arguments given as a JSON string
  CHECK(p.calls[0].arguments == R"({"city": "Lima"})");

  // not calls: the text stays content
  for (const char* text :
       {"The weather is fine.", "<tool_call>{\"name\": \"launch_rockets\", \"arguments\": {}}</tool_call>",
        "<tool_call>{not json}</tool_call>", "{\"city\": \"Paris\"}",
        "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> and then prose"}) {
    INFO(text);
    p = parse_tool_calls(text, tools);
    CHECK(p.calls.empty());
    CHECK(p.content == text);
  }
}

TEST_CASE("streamed content stops where a tool call may begin", "[tools]") {
  CHECK(tool_content_prefix("Hello there") == 11);
  CHECK(tool_content_prefix("Hello <tool") == 6);
  CHECK(tool_content_prefix("Hello <tool_call>{\"na") == 6);
  CHECK(tool_content_prefix("Hi [TOOL_") == 3);
  CHECK(tool_content_prefix("a < b") == 5);
  CHECK(tool_content_prefix("  {\"name\"") == 0);
}

TEST_CASE("the forced-call grammar takes only valid calls", "[tools]") {
  const auto tools = weather_tools();
  auto req = tool_call_grammar(tools, {ToolChoice::Kind::Required, ""}, true);
  REQUIRE(req.ok());
  const std::string one =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  const std::string two =
      one + "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>";
  CHECK(matches(*req, one));
  CHECK(matches(*req, two));
  CHECK_FALSE(matches(*req, "Sure! " + one));
  CHECK_FALSE(
      matches(*req, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
  CHECK_FALSE(matches(
      *req,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"unit\": \"k\"}}\n</tool_call>"));
  CHECK_FALSE(matches(*req, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  auto single = tool_call_grammar(tools, {ToolChoice::Kind::Required, ""}, false);
  REQUIRE(single.ok());
  CHECK(matches(*single, one));
  CHECK_FALSE(matches(*single, two));
  auto named = tool_call_grammar(tools, {ToolChoice::Kind::Named, "get_time"}, true);
  REQUIRE(named.ok());
  CHECK_FALSE(matches(*named, one));
  CHECK(matches(*named, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"));
  CHECK_FALSE(tool_call_grammar(tools, {ToolChoice::Kind::Named, "nope"}, true).ok());
  // what the grammar makes parses back into the same call
  auto p = parse_tool_calls(two, tools);
  REQUIRE(p.calls.size() == 2);
  // and earlier calls are written back in the format the parser reads
  const std::string rendered = render_tool_calls(p.calls);
  CHECK(parse_tool_calls(rendered, tools).calls.size() == 2);
  CHECK(matches(*req, rendered));
  CHECK(tools_system_prompt(tools).find("\"name\":\"get_weather\"") != std::string::npos);
}
