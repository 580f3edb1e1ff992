// OpenAI request parsing: every malformed body, wrong type and out-of-range value becomes
// an ApiError with the right status and param; valid bodies fill GenerationRequest.
#include "apps/serve/openai_request.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/grammar/grammar.h"

using namespace troupe::api;
using nlohmann::json;

namespace {

Limits limits() {
  Limits l;
  l.vocab_size = 1000;
  l.max_context = 4096;
  l.model_names = {"m"};
  return l;
}

// Completions body with `extra` merged in (a JSON object's members, without braces).
std::string comp(const std::string& extra = "") {
  return R"({"model":"m","prompt":"hi")" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string chat(const std::string& extra = "") {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}

GenerationRequest ok(const std::string& body, bool is_chat = false, const Limits& lim = limits()) {
  auto r = parse_generation(body, is_chat, lim);
  if (auto* e = std::get_if<ApiError>(&r)) FAIL("unexpected error: " << e->message << " for " << body.substr(0, 200));
  return std::get<GenerationRequest>(r);
}

ApiError err(const std::string& body, bool is_chat = false, const Limits& lim = limits()) {
  auto r = parse_generation(body, is_chat, lim);
  if (!std::holds_alternative<ApiError>(r)) FAIL("expected an error for " << body.substr(0, 200));
  return std::get<ApiError>(r);
}

void bad(const std::string& body, const std::string& param, bool is_chat = false) {
  INFO(body.substr(0, 200));
  const ApiError e = err(body, is_chat);
  CHECK(e.status == 400);
  CHECK(e.param == param);
  CHECK(e.type == "invalid_request_error");
  CHECK(!e.message.empty());
  CHECK_NOTHROW(json::parse(error_json(e)));
}

}  // namespace

TEST_CASE("error_json has OpenAI's shape", "[api]") {
  ApiError e;
  e.message = "bad";
  json j = json::parse(error_json(e));
  CHECK(j == json{{"error",
                   {{"message", "bad"}, {"type", "invalid_request_error"}, {"param", nullptr}, {"code", nullptr}}}});
  e.param = "n";
  e.code = "model_not_found";
  j = json::parse(error_json(e));
  CHECK(j["error"]["param"] == "n");
  CHECK(j["error"]["code"] == "model_not_found");
  e.message = "x\xff";  // invalid UTF-8 never makes error_json throw
  CHECK_NOTHROW(json::parse(error_json(e)));
}

TEST_CASE("body must be valid JSON, an object, not too deep", "[api]") {
  bad("", "");
  bad("{", "");
  bad("{\"prompt\":\"hi\"} trailing", "");
  bad("[1,2]", "");
  bad("\"text\"", "");
  bad("42", "");
  bad("null", "");
  CHECK(err("[]").message == "request body must be a JSON object");
  // Invalid UTF-8 inside a string, and a lone surrogate escape.
  bad(std::string("{\"model\":\"m\",\"prompt\":\"a\xff") + "b\"}", "");
  bad(R"({"model":"m","prompt":"\ud800"})", "");
  // 100000-deep nesting: refused without recursion.
  bad(std::string(100000, '['), "");
  bad(R"({"model":"m","prompt":"hi","x":)" + std::string(100000, '[') + std::string(100000, ']') + "}", "");
  bad(R"({"model":"m","prompt":"hi","x":)" + std::string(100000, '{'), "");
  // Exactly at the limit is fine; brackets inside strings do not count.
  Limits l = limits();
  l.max_json_depth = 3;
  CHECK(std::holds_alternative<GenerationRequest>(parse_generation(R"({"prompt":"[[[[[[","x":[[1]]})", false, l)));
  CHECK(std::holds_alternative<ApiError>(parse_generation(R"({"prompt":"hi","x":[[[1]]]})", false, l)));
  CHECK(std::holds_alternative<GenerationRequest>(parse_generation(R"({"prompt":"\"[[[[\\","x":[[1]]})", false, l)));
  // A number beyond double's range.
  bad(comp(R"("temperature":1e999)"), "");
  bad(comp(R"("max_tokens":-1e400)"), "");
  // Unknown fields are ignored.
  ok(comp(R"("frobnicate":{"a":[1,2]},"best_of":7)"));
}

TEST_CASE("model names", "[api]") {
  ApiError e = err(R"({"model":"gpt-4","prompt":"hi"})");
  CHECK(e.status == 404);
  CHECK(e.code == "model_not_found");
  CHECK(e.type == "invalid_request_error");
  CHECK(e.param == "model");
  CHECK(e.message == "The model `gpt-4` does not exist.");
  CHECK(json::parse(error_json(e))["error"]["code"] == "model_not_found");
  CHECK(err(R"({"model":"m","messages":[]})", true).status == 400);
  CHECK(err(R"({"model":"x","messages":[{"role":"user","content":"a"}]})", true).status == 404);
  bad(R"({"model":5,"prompt":"hi"})", "model");
  // Missing or null model is allowed; any model passes when the list is empty.
  CHECK(ok(R"({"prompt":"hi"})").model.empty());
  ok(R"({"model":null,"prompt":"hi"})");
  Limits any = limits();
  any.model_names.clear();
  CHECK(ok(R"({"model":"whatever","prompt":"hi"})", false, any).model == "whatever");
  CHECK(ok(comp()).model == "m");
}

TEST_CASE("completions prompt forms", "[api]") {
  GenerationRequest r = ok(comp());
  REQUIRE(r.prompts.size() == 1);
  CHECK(r.prompts[0].text == "hi");
  CHECK(!r.is_chat);

  r = ok(R"({"prompt":[1,2,999]})");
  REQUIRE(r.prompts.size() == 1);
  CHECK(!r.prompts[0].text);
  CHECK(r.prompts[0].token_ids == std::vector<int32_t>{1, 2, 999});

  r = ok(R"({"prompt":["a","bc"]})");
  REQUIRE(r.prompts.size() == 2);
  CHECK(r.prompts[0].text == "a");
  CHECK(r.prompts[1].text == "bc");

  r = ok(R"({"prompt":[[1,2],[3]]})");
  REQUIRE(r.prompts.size() == 2);
  CHECK(r.prompts[0].token_ids == std::vector<int32_t>{1, 2});
  CHECK(r.prompts[1].token_ids == std::vector<int32_t>{3});
}

TEST_CASE("completions prompt errors", "[api]") {
  bad(R"({"model":"m"})", "prompt");
  bad(R"({"prompt":null})", "prompt");
  bad(R"({"prompt":""})", "prompt");
  bad(R"({"prompt":[]})", "prompt");
  bad(R"({"prompt":[[]]})", "prompt");
  bad(R"({"prompt":["a",""]})", "prompt");
  bad(R"({"prompt":5})", "prompt");
  bad(R"({"prompt":{"a":1}})", "prompt");
  bad(R"({"prompt":[1000]})", "prompt");  // == vocab_size
  bad(R"({"prompt":[-1]})", "prompt");
  bad(R"({"prompt":[1,1.5]})", "prompt");
  bad(R"({"prompt":[1,"a"]})", "prompt");
  bad(R"({"prompt":["a",[1]]})", "prompt");
  bad(R"({"prompt":[[1],"a"]})", "prompt");
  bad(R"({"prompt":[[1],[5000]]})", "prompt");
  bad(R"({"prompt":[[1],2]})", "prompt");
  bad(R"({"prompt":[true]})", "prompt");
  bad(R"({"prompt":[18446744073709551615]})", "prompt");
  std::string many = "[";
  for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"a\"";
  bad(R"({"prompt":)" + many + "]}", "prompt");
  many = "[";
  for (int i = 0; i < 64; ++i) many += std::string(i ? "," : "") + "[1]";
  CHECK(ok(R"({"prompt":)" + many + "]}").prompts.size() == 64);
}

TEST_CASE("chat messages", "[api]") {
  GenerationRequest r = ok(
      R"({"messages":[{"role":"system","content":"s"},{"role":"developer","content":"d"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":null},{"role":"assistant"},{"role":"tool","content":"t","tool_call_id":"x"}]})",
      true);
  REQUIRE(r.messages.size() == 6);
  CHECK(r.is_chat);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].role == "developer");
  CHECK(r.messages[2].content == "a\nb");
  CHECK(r.messages[3].content.empty());
  CHECK(r.messages[4].role == "assistant");
  CHECK(r.messages[5].role == "user");  // a tool result is the next user turn, wrapped
  CHECK(r.messages[5].content == "<tool_response>\nt\n</tool_response>");
  CHECK(r.prompts.empty());

  bad(R"({"model":"m"})", "messages", true);
  bad(R"({"messages":[]})", "messages", true);
  bad(R"({"messages":{}})", "messages", true);
  bad(R"({"messages":"hi"})", "messages", true);
  bad(R"({"messages":["hi"]})", "messages", true);
  bad(R"({"messages":[{"role":"wizard","content":"a"}]})", "messages", true);
  bad(R"({"messages":[{"role":5,"content":"a"}]})", "messages", true);
  bad(R"({"messages":[{"content":"a"}]})", "messages", true);
  bad(R"({"messages":[{"role":"user"}]})", "messages", true);
  bad(R"({"messages":[{"role":"user","content":null}]})", "messages", true);
  bad(R"({"messages":[{"role":"user","content":5}]})", "messages", true);
  bad(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages", true);
  bad(R"({"messages":[{"role":"user","content":[{"type":"text","text":1}]}]})", "messages", true);
  bad(R"({"messages":[{"role":"user","content":["a"]}]})", "messages", true);
  const ApiError e =
      err(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", true);
  CHECK(e.param == "messages");
  CHECK(e.message.find("only text content parts are supported") != std::string::npos);

  Limits l = limits();
  l.max_messages = 2;
  const std::string m = R"({"role":"user","content":"a"})";
  CHECK(std::holds_alternative<GenerationRequest>(parse_generation("{\"messages\":[" + m + "," + m + "]}", true, l)));
  CHECK(std::get<ApiError>(parse_generation("{\"messages\":[" + m + "," + m + "," + m + "]}", true, l)).param ==
        "messages");
}

TEST_CASE("n: 1..max_n", "[api]") {
  CHECK(ok(comp()).n == 1);
  CHECK(ok(comp(R"("n":16)")).n == 16);
  CHECK(ok(comp(R"("n":null)")).n == 1);
  for (const char* v : {"0", "-1", "17", "1.5", "\"2\"", "true", "1e12", "18446744073709551615", "[1]"})
    bad(comp(std::string("\"n\":") + v), "n");
  // n is checked before the prompt: a huge n with no prompt still names n.
  bad(R"({"n":1000000})", "n");
  bad(R"({"n":0})", "n", true);
}

TEST_CASE("max_tokens and max_completion_tokens", "[api]") {
  CHECK(!ok(comp()).max_tokens);
  CHECK(ok(comp(R"("max_tokens":10)")).max_tokens == 10);
  CHECK(ok(comp(R"("max_tokens":10.0)")).max_tokens == 10);  // integral float, as pydantic
  CHECK(ok(comp(R"("max_tokens":4096)")).max_tokens == 4096);
  CHECK(ok(chat(R"("max_completion_tokens":7)"), true).max_tokens == 7);
  CHECK(ok(chat(R"("max_tokens":9,"max_completion_tokens":7)"), true).max_tokens == 7);
  for (const char* v :
       {"0", "-5", "1.5", "\"10\"", "1e12", "4097", "true", "{}", "18446744073709551615", "-9223372036854775808"})
    bad(comp(std::string("\"max_tokens\":") + v), "max_tokens");
  bad(chat(R"("max_completion_tokens":0)"), "max_completion_tokens", true);
  bad(chat(R"("max_tokens":-1)"), "max_tokens", true);
}

TEST_CASE("sampling parameters: types and ranges", "[api]") {
  GenerationRequest r = ok(comp(R"("temperature":0,"top_p":0.5,"top_k":40,"min_p":0.1,"presence_penalty":-2,
                                   "frequency_penalty":2,"repetition_penalty":1.2)"));
  CHECK(r.seq.sampling.temperature == 0.0f);
  CHECK(r.seq.sampling.top_p == 0.5f);
  CHECK(r.seq.sampling.top_k == 40);
  CHECK(r.seq.sampling.min_p == Approx(0.1));
  CHECK(r.seq.sampling.presence_penalty == -2.0f);
  CHECK(r.seq.sampling.frequency_penalty == 2.0f);
  CHECK(r.seq.sampling.repetition_penalty == Approx(1.2));
  CHECK(ok(comp(R"("top_k":-1)")).seq.sampling.top_k == 0);
  CHECK(ok(comp(R"("top_k":0)")).seq.sampling.top_k == 0);
  CHECK(ok(comp(R"("temperature":2,"top_p":1,"min_p":1,"repetition_penalty":2)")).seq.sampling.temperature == 2.0f);
  CHECK(ok(comp(R"("temperature":null)")).seq.sampling.temperature == 1.0f);
  r = ok(comp());
  CHECK(r.seq.sampling.temperature == 1.0f);
  CHECK(r.seq.sampling.top_p == 1.0f);

  const std::vector<std::pair<const char*, std::vector<const char*>>> cases = {
      {"temperature", {"-0.1", "2.01", "\"1\"", "true", "1e308", "[1]"}},
      {"top_p", {"0", "-0.5", "1.01", "\"0.5\"", "1e-320"}},
      {"top_k", {"-2", "1.5", "\"5\"", "3000000000"}},
      {"min_p", {"-0.01", "1.5", "false"}},
      {"presence_penalty", {"-2.5", "2.5", "\"0\""}},
      {"frequency_penalty", {"-3", "3", "{}"}},
      {"repetition_penalty", {"0", "-1", "2.5", "\"1\""}},
  };
  for (const auto& [name, values] : cases)
    for (const char* v : values) bad(comp("\"" + std::string(name) + "\":" + v), name);
  bad(chat(R"("temperature":5)"), "temperature", true);
}

TEST_CASE("logprobs: completions int, chat bool + top_logprobs", "[api]") {
  GenerationRequest r = ok(comp(R"("logprobs":5)"));
  CHECK(r.logprobs);
  CHECK(r.top_logprobs == 5);
  CHECK(r.seq.sampling.logprobs == 5);
  CHECK(r.seq.sampling.report_logprob);
  CHECK(!ok(comp()).seq.sampling.report_logprob);  // nobody asked: the sampler skips the log-softmax
  r = ok(comp(R"("logprobs":0)"));
  CHECK(r.logprobs);
  CHECK(r.top_logprobs == 0);
  CHECK(!ok(comp()).logprobs);
  CHECK(ok(comp(R"("logprobs":20)")).top_logprobs == 20);
  for (const char* v : {"-1", "21", "true", "1.5", "\"3\""}) bad(comp(std::string("\"logprobs\":") + v), "logprobs");

  r = ok(chat(R"("logprobs":true,"top_logprobs":3)"), true);
  CHECK(r.logprobs);
  CHECK(r.top_logprobs == 3);
  CHECK(r.seq.sampling.logprobs == 3);
  r = ok(chat(R"("logprobs":true)"), true);
  CHECK(r.logprobs);
  CHECK(r.seq.sampling.report_logprob);
  CHECK(r.top_logprobs == 0);
  CHECK(!ok(chat(R"("logprobs":false)"), true).logprobs);
  bad(chat(R"("logprobs":5)"), "logprobs", true);
  bad(chat(R"("top_logprobs":3)"), "top_logprobs", true);
  bad(chat(R"("logprobs":false,"top_logprobs":0)"), "top_logprobs", true);
  bad(chat(R"("logprobs":true,"top_logprobs":21)"), "top_logprobs", true);
  bad(chat(R"("logprobs":true,"top_logprobs":-1)"), "top_logprobs", true);
  bad(chat(R"("logprobs":true,"top_logprobs":"3")"), "top_logprobs", true);
}

TEST_CASE("stop strings and stop_token_ids", "[api]") {
  CHECK(ok(comp(R"("stop":"\n")")).stop == std::vector<std::string>{"\n"});
  CHECK(ok(comp(R"("stop":["a","b","c","d"])")).stop.size() == 4);
  CHECK(ok(comp(R"("stop":[])")).stop.empty());
  CHECK(ok(comp(R"("stop":null)")).stop.empty());
  CHECK(ok(comp("\"stop\":\"" + std::string(256, 'x') + "\"")).stop[0].size() == 256);
  bad(comp(R"("stop":["a","b","c","d","e"])"), "stop");
  bad(comp("\"stop\":\"" + std::string(10240, 'x') + "\""), "stop");
  bad(comp("\"stop\":[\"a\",\"" + std::string(257, 'x') + "\"]"), "stop");
  bad(comp(R"("stop":"")"), "stop");
  bad(comp(R"("stop":5)"), "stop");
  bad(comp(R"("stop":["a",5])"), "stop");
  bad(comp(R"("stop":{"a":"b"})"), "stop");

  CHECK(ok(comp(R"("stop_token_ids":[0,999])")).seq.stop_token_ids == std::vector<int32_t>{0, 999});
  bad(comp(R"("stop_token_ids":[1000])"), "stop_token_ids");
  bad(comp(R"("stop_token_ids":[-1])"), "stop_token_ids");
  bad(comp(R"("stop_token_ids":5)"), "stop_token_ids");
  bad(comp(R"("stop_token_ids":["1"])"), "stop_token_ids");
  std::string ids = "[";
  for (int i = 0; i < 65; ++i) ids += std::string(i ? "," : "") + "1";
  bad(comp("\"stop_token_ids\":" + ids + "]"), "stop_token_ids");
}

TEST_CASE("response_format", "[api]") {
  CHECK_FALSE(ok(comp("")).seq.sampling.json_object);
  CHECK_FALSE(ok(comp(R"("response_format":{"type":"text"})")).seq.sampling.json_object);
  CHECK_FALSE(ok(comp(R"("response_format":null)")).seq.sampling.json_object);
  CHECK(ok(comp(R"("response_format":{"type":"json_object"})")).seq.sampling.json_object);
  bad(comp(R"("response_format":{"type":"yaml"})"), "response_format");
  bad(comp(R"("response_format":{"type":1})"), "response_format");
  bad(comp(R"("response_format":{})"), "response_format");
  bad(comp(R"("response_format":"json_object")"), "response_format");
  bad(comp(R"("response_format":{"type":"json_object"},"ignore_eos":true)"), "response_format");
}

TEST_CASE("structured output fields become one grammar", "[api]") {
  const auto schema = ok(comp(R"("response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,
      "schema":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}},"required":["z","a"]}}})"));
  CHECK_FALSE(schema.seq.sampling.json_object);
  const std::string& g = schema.seq.sampling.grammar;
  REQUIRE_FALSE(g.empty());
  auto compiled = troupe::Grammar::compile(g);
  REQUIRE(compiled.ok());
  troupe::GrammarState in_order(**compiled), sorted(**compiled);  // properties in the schema's order, not sorted
  CHECK((in_order.feed(R"({"z":1,"a":"x"})") && in_order.accepting()));
  CHECK_FALSE(sorted.feed(R"({"a":"x","z":1})"));
  CHECK(ok(comp(R"("guided_json":{"type":"boolean"})")).seq.sampling.grammar.find("boolean") != std::string::npos);
  CHECK_FALSE(ok(comp(R"("guided_json":"{\"type\":\"null\"}")")).seq.sampling.grammar.empty());
  CHECK_FALSE(ok(comp(R"("guided_regex":"[a-z]+")")).seq.sampling.grammar.empty());
  CHECK(ok(comp(R"("guided_choice":["yes","no"])")).seq.sampling.grammar == "root ::= \"yes\" | \"no\"\n");
  CHECK(ok(comp(R"("guided_grammar":"root ::= [0-9]+")")).seq.sampling.grammar == "root ::= [0-9]+");
  CHECK_FALSE(ok(comp(R"("structured_outputs":{"regex":"x+"})")).seq.sampling.grammar.empty());
  CHECK(ok(comp(R"("guided_regex":null)")).seq.sampling.grammar.empty());
  bad(comp(R"("response_format":{"type":"json_schema"})"), "response_format");
  bad(comp(
          R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","format":"email"}}})"),
      "response_format");
  bad(comp(R"("guided_json":{"type":"string","maxLenght":3})"), "guided_json");
  bad(comp(R"("guided_json":"{not json")"), "guided_json");
  bad(comp(R"("guided_regex":"(a")"), "guided_regex");
  bad(comp(R"("guided_regex":5)"), "guided_regex");
  bad(comp(R"("guided_choice":[])"), "guided_choice");
  bad(comp(R"("guided_choice":["a",1])"), "guided_choice");
  bad(comp(R"("guided_grammar":"root ::= root")"), "guided_grammar");
  bad(comp(R"("guided_grammar":"start ::= \"a\"")"), "guided_grammar");
  bad(comp(R"("structured_outputs":{"yaml":"x"})"), "structured_outputs");
  bad(comp(R"("guided_regex":"a","guided_choice":["a"])"), "guided_choice");
  bad(comp(R"("response_format":{"type":"json_object"},"guided_regex":"a")"), "guided_regex");
  bad(comp(R"("guided_regex":"a","ignore_eos":true)"), "guided_regex");
}

TEST_CASE("tools: offered functions, earlier calls and results, forced calls", "[api]") {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","description":"does f",
          "parameters":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}}}])";
  auto body = [&](const std::string& extra) {
    return R"({"messages":[{"role":"user","content":"hi"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"2"},{"role":"tool","tool_call_id":"call_2","content":"3"}],)" +
           tools + extra + "}";
  };
  GenerationRequest r = ok(body(""), true);
  REQUIRE(r.tools.size() == 1);
  CHECK(r.tools_active());
  REQUIRE(r.messages.size() == 4);  // the tools' system message first; the two results one turn
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content.find("<tools>") != std::string::npos);
  CHECK(r.messages[2].content.find("<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}\n</tool_call>") !=
        std::string::npos);
  CHECK(r.messages[3].content == "<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response>");
  CHECK(r.seq.sampling.grammar.empty());  // auto: unconstrained
  CHECK_FALSE(ok(body(R"(,"tool_choice":"required")"), true).seq.sampling.grammar.empty());
  CHECK_FALSE(
      ok(body(R"(,"tool_choice":{"type":"function","function":{"name":"f"}})"), true).seq.sampling.grammar.empty());
  const auto none = ok(body(R"(,"tool_choice":"none")"), true);
  CHECK_FALSE(none.tools_active());
  CHECK(none.messages.size() == 4);  // the tools section still (the model sees the earlier calls' context)
  CHECK(none.seq.sampling.grammar.empty());
  CHECK_FALSE(ok(body(R"(,"parallel_tool_calls":false)"), true).parallel_tool_calls);
  bad(body(R"(,"tool_choice":{"type":"function","function":{"name":"g"}})"), "tool_choice", true);
  bad(body(R"(,"tool_choice":"maybe")"), "tool_choice", true);
  bad(body(R"(,"tool_choice":"required","guided_regex":"a")"), "tool_choice", true);
  bad(R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"required"})", "tool_choice", true);
  bad(R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]})", "tools", true);
  bad(R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":""}}]})", "tools",
      true);
  bad(R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":3}}]})",
      "tools", true);
  bad(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":5}}]}]})", "messages", true);
  bad(comp(R"("tools":[])"), "tools");  // completions: no tools
}

TEST_CASE("logit_bias", "[api]") {
  GenerationRequest r = ok(comp(R"("logit_bias":{"5":-100,"999":100,"0":0.5})"));
  REQUIRE(r.seq.sampling.logit_bias.size() == 3);
  CHECK(r.seq.sampling.logit_bias.at(5) == -100.0f);
  CHECK(r.seq.sampling.logit_bias.at(999) == 100.0f);
  CHECK(r.seq.sampling.logit_bias.at(0) == 0.5f);
  for (const char* k : {"abc", "-1", "999999", "1000", "", " 5", "+5", "5.0", "0x10", "99999999999999999999"})
    bad(comp("\"logit_bias\":{\"" + std::string(k) + "\":1}"), "logit_bias");
  bad(comp(R"("logit_bias":{"5":100.5})"), "logit_bias");
  bad(comp(R"("logit_bias":{"5":-101})"), "logit_bias");
  bad(comp(R"("logit_bias":{"5":"1"})"), "logit_bias");
  bad(comp(R"("logit_bias":{"5":null})"), "logit_bias");
  bad(comp(R"("logit_bias":[1,2])"), "logit_bias");
  bad(comp(R"("logit_bias":{"5":1e999})"), "");  // not even parseable
  Limits l = limits();
  l.max_logit_bias = 2;
  CHECK(std::get<ApiError>(parse_generation(comp(R"("logit_bias":{"1":1,"2":1,"3":1})"), false, l)).param ==
        "logit_bias");
}

TEST_CASE("seed", "[api]") {
  CHECK(!ok(comp()).has_seed);
  GenerationRequest r = ok(comp(R"("seed":42)"));
  CHECK(r.has_seed);
  CHECK(r.seq.sampling.seed == 42u);
  CHECK(ok(comp(R"("seed":0)")).has_seed);
  CHECK(ok(comp(R"("seed":-1)")).seq.sampling.seed == UINT64_MAX);
  CHECK(ok(comp(R"("seed":18446744073709551615)")).seq.sampling.seed == UINT64_MAX);
  CHECK(ok(comp(R"("seed":-9223372036854775808)")).seq.sampling.seed == (uint64_t{1} << 63));
  for (const char* v : {"1.5", "18446744073709551616", "-9223372036854775809", "1e3", "\"1\"", "true", "[1]"})
    bad(comp(std::string("\"seed\":") + v), "seed");
}

TEST_CASE("stream, stream_options and flags", "[api]") {
  GenerationRequest r = ok(comp(R"("stream":true,"stream_options":{"include_usage":true})"));
  CHECK(r.stream);
  CHECK(r.include_usage);
  r = ok(comp(R"("stream":true,"stream_options":{})"));
  CHECK(r.stream);
  CHECK(!r.include_usage);
  CHECK(!ok(comp()).stream);
  bad(comp(R"("stream_options":{"include_usage":true})"), "stream_options");
  bad(comp(R"("stream":false,"stream_options":{"include_usage":true})"), "stream_options");
  bad(comp(R"("stream":true,"stream_options":{"include_usage":1})"), "stream_options");
  bad(comp(R"("stream":true,"stream_options":true)"), "stream_options");
  bad(comp(R"("stream":"yes")"), "stream");
  bad(comp(R"("stream":1)"), "stream");

  r = ok(comp(R"("echo":true,"ignore_eos":true,"priority":-7,"user":"u1")"));
  CHECK(r.echo);
  CHECK(r.seq.ignore_eos);
  CHECK(r.seq.priority == -7);
  CHECK(r.user == "u1");
  CHECK(!ok(chat(R"("echo":"ignored in chat")"), true).echo);
  bad(comp(R"("echo":1)"), "echo");
  bad(comp(R"("ignore_eos":"true")"), "ignore_eos");
  bad(comp(R"("priority":2147483648)"), "priority");
  bad(comp(R"("priority":1.5)"), "priority");
  bad(comp(R"("user":5)"), "user");
}

TEST_CASE("check_prompt_fits", "[api]") {
  const Limits l = limits();  // max_context 4096
  GenerationRequest r = ok(comp());
  CHECK(std::get<int32_t>(check_prompt_fits(96, r, l)) == 4000);
  CHECK(std::get<int32_t>(check_prompt_fits(4095, r, l)) == 1);
  ApiError e = std::get<ApiError>(check_prompt_fits(0, r, l));
  CHECK(e.param == "prompt");
  CHECK(e.status == 400);
  e = std::get<ApiError>(check_prompt_fits(4096, r, l));
  CHECK(e.param == "prompt");
  CHECK(e.message.find("4096") != std::string::npos);
  CHECK(std::get<ApiError>(check_prompt_fits(1000000, r, l)).param == "prompt");

  r = ok(comp(R"("max_tokens":100)"));
  CHECK(std::get<int32_t>(check_prompt_fits(3996, r, l)) == 100);
  e = std::get<ApiError>(check_prompt_fits(4000, r, l));
  CHECK(e.status == 400);
  CHECK(e.param == "max_tokens");
  CHECK(e.message ==
        "This model's maximum context length is 4096 tokens. However, you requested 4100 tokens (4000 in the prompt, "
        "100 in the completion). Please reduce the length of the prompt or completion.");

  GenerationRequest c = ok(chat(R"("max_tokens":4096)"), true);
  e = std::get<ApiError>(check_prompt_fits(5, c, l));
  CHECK(e.param == "max_tokens");
  CHECK(e.message.find("(5 in the messages, 4096 in the completion)") != std::string::npos);
  CHECK(std::get<ApiError>(check_prompt_fits(0, c, l)).param == "messages");
}

TEST_CASE("validate() of the sampler is applied", "[api]") {
  // Caps wider than the sampler's own (logprobs 0..20) still end in a 400 naming the param.
  Limits l = limits();
  l.max_top_logprobs = 50;
  const ApiError e = std::get<ApiError>(parse_generation(comp(R"("logprobs":30)"), false, l));
  CHECK(e.status == 400);
  CHECK(e.param == "logprobs");
}

TEST_CASE("tokenize and detokenize", "[api]") {
  const Limits l = limits();
  TokenizeRequest t = std::get<TokenizeRequest>(parse_tokenize(R"({"model":"m","prompt":"hello"})", l));
  CHECK(t.prompt == "hello");
  CHECK(t.add_special_tokens);
  CHECK(t.add_generation_prompt);
  t = std::get<TokenizeRequest>(parse_tokenize(
      R"({"messages":[{"role":"user","content":"a"}],"add_generation_prompt":false,"add_special_tokens":false})", l));
  CHECK(!t.prompt);
  REQUIRE(t.messages.size() == 1);
  CHECK(t.messages[0].content == "a");
  CHECK(!t.add_generation_prompt);
  CHECK(!t.add_special_tokens);
  CHECK(std::get<TokenizeRequest>(parse_tokenize(R"({"prompt":""})", l)).prompt == "");
  CHECK(std::get<ApiError>(parse_tokenize(R"({})", l)).status == 400);
  CHECK(std::get<ApiError>(parse_tokenize(R"({"prompt":"a","messages":[{"role":"user","content":"a"}]})", l)).status ==
        400);
  CHECK(std::get<ApiError>(parse_tokenize(R"({"prompt":5})", l)).param == "prompt");
  CHECK(std::get<ApiError>(parse_tokenize(R"({"messages":[]})", l)).param == "messages");
  CHECK(std::get<ApiError>(parse_tokenize(R"({"prompt":"a","add_special_tokens":"no"})", l)).param ==
        "add_special_tokens");
  CHECK(std::get<ApiError>(parse_tokenize(R"({"model":"zz","prompt":"a"})", l)).status == 404);
  CHECK(std::get<ApiError>(parse_tokenize("[1]", l)).status == 400);
  CHECK(std::get<ApiError>(parse_tokenize(std::string(100000, '{'), l)).status == 400);

  CHECK(std::get<std::vector<int32_t>>(parse_detokenize(R"({"model":"m","tokens":[1,2,999]})", l)) ==
        std::vector<int32_t>{1, 2, 999});
  CHECK(std::get<std::vector<int32_t>>(parse_detokenize(R"({"tokens":[]})", l)).empty());
  for (const char* b :
       {R"({})", R"({"tokens":[1000]})", R"({"tokens":[-1]})", R"({"tokens":"1 2"})", R"({"tokens":[1.5]})"})
    CHECK(std::get<ApiError>(parse_detokenize(b, l)).param == "tokens");
  CHECK(std::get<ApiError>(parse_detokenize(R"({"model":"zz","tokens":[]})", l)).status == 404);
  CHECK(std::get<ApiError>(parse_detokenize("not json", l)).status == 400);
}
