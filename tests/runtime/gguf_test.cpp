// The GGUF reader on valid files (every metadata type, nested arrays) and on every hostile
// case of RELIABILITY.md's model-file list: each must give one clear error, no crash and
// no huge allocation. Truncation is tried at every byte of a small valid file.
#include <catch2/catch.hpp>
#include <cstring>

#include "runtime/format/gguf.h"
#include "runtime/model/model_files.h"
#include "tests/runtime/tiny_model.h"

using namespace troupe;

namespace {

// Hand-written GGUF bytes for cases the Writer cannot express.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return put<uint32_t>(0x46554747u).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Bytes& pad(size_t align = 32) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
};

std::string parse_error(const std::vector<uint8_t>& b) {
  auto r = gguf::File::parse(b.data(), b.size());
  if (r.ok()) return "";
  return r.error().message;
}

// One tensor "t" with the given dims/type/offset and `data_bytes` bytes of data.
std::vector<uint8_t> one_tensor(std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data_bytes) {
  Bytes x;
  x.header(1, 0).str("t").put<uint32_t>(static_cast<uint32_t>(dims.size()));
  for (auto d : dims) x.put<uint64_t>(d);
  x.put<uint32_t>(type).put<uint64_t>(offset).pad();
  x.b.resize(x.b.size() + data_bytes, 0);
  return x.b;
}

}  // namespace

TEST_CASE("GGUF metadata of every value type round-trips", "[gguf]") {
  Bytes x;
  x.header(0, 14);
  x.str("u8").put<uint32_t>(0).put<uint8_t>(200);
  x.str("i8").put<uint32_t>(1).put<int8_t>(-5);
  x.str("u16").put<uint32_t>(2).put<uint16_t>(60000);
  x.str("i16").put<uint32_t>(3).put<int16_t>(-30000);
  x.str("u32").put<uint32_t>(4).put<uint32_t>(4000000000u);
  x.str("i32").put<uint32_t>(5).put<int32_t>(-7);
  x.str("f32").put<uint32_t>(6).put<float>(1.5f);
  x.str("bool").put<uint32_t>(7).put<uint8_t>(1);
  x.str("str").put<uint32_t>(8).str("héllo");
  x.str("u64").put<uint32_t>(10).put<uint64_t>(1ull << 40);
  x.str("i64").put<uint32_t>(11).put<int64_t>(-(1ll << 40));
  x.str("f64").put<uint32_t>(12).put<double>(0.25);
  x.str("arr").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("bc");
  // Nested: array of 2 arrays of i32.
  x.str("nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(2);
  x.put<uint32_t>(5).put<uint64_t>(1).put<int32_t>(3);
  x.put<uint32_t>(5).put<uint64_t>(2).put<int32_t>(4).put<int32_t>(5);
  auto f = gguf::File::parse(x.b.data(), x.b.size());
  REQUIRE(f.ok());
  REQUIRE(*f->opt_int("u8") == 200);
  REQUIRE(*f->opt_int("i8") == -5);
  REQUIRE(*f->opt_int("u16") == 60000);
  REQUIRE(*f->opt_int("i16") == -30000);
  REQUIRE(*f->opt_int("u32") == 4000000000ll);
  REQUIRE(*f->opt_int("i32") == -7);
  REQUIRE(*f->opt_number("f32") == 1.5);
  REQUIRE(*f->opt_bool("bool"));
  REQUIRE(*f->opt_string("str") == "héllo");
  REQUIRE(*f->opt_int("u64") == (1ll << 40));
  REQUIRE(*f->opt_int("i64") == -(1ll << 40));
  REQUIRE(*f->opt_number("f64") == 0.25);
  REQUIRE(f->find("arr")->array.size() == 2);
  REQUIRE(f->find("arr")->array[1].s == "bc");
  REQUIRE(f->find("nested")->array[1].array[1].i == 5);
}

namespace {
// A small complete file (metadata of several types and three tensors) for the
// every-byte truncation sweep.
std::vector<uint8_t> small_file() {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 1);
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_bool("flag", true);
  w.add_string_array("tokenizer.ggml.tokens", {"a", "bb", "ccc"});
  w.add_i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  w.add_f32_array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  std::vector<uint8_t> q(2 * 20, 7), f(64 * 4, 1), h(32 * 2, 3);
  w.add_tensor("q", DType::Q4_1, {32, 2}, q);
  w.add_tensor("f", DType::F32, {64}, f);
  w.add_tensor("h", DType::F16, {32}, h);
  return w.bytes();
}
}  // namespace

TEST_CASE("every truncation of a valid file fails cleanly", "[gguf][badinput]") {
  auto bytes = small_file();
  REQUIRE(gguf::File::parse(bytes.data(), bytes.size()).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    // Copy the prefix so that any read past it would be caught by sanitizers and valgrind.
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(n));
    auto r = gguf::File::parse(prefix.data(), prefix.size());
    if (r.ok()) FAIL("prefix of " << n << " bytes parsed");
  }
}

TEST_CASE("the tiny model file parses and truncations fail cleanly", "[gguf][badinput]") {
  auto bytes = test::tiny_model_writer().bytes();
  auto f = gguf::File::parse(bytes.data(), bytes.size());
  REQUIRE(f.ok());
  REQUIRE(f->tensors().size() == 2 + 2 * 9 + 1);
  // The last tensor's data ends exactly at the end of the file (no trailing padding), so
  // every strict prefix must be rejected.
  uint64_t end = 0;
  for (const auto& t : f->tensors())
    end = std::max<uint64_t>(end, static_cast<uint64_t>(t.data - bytes.data()) + t.nbytes);
  REQUIRE(end == bytes.size());
  // Every byte of the header and metadata, then every 101st byte of the tensor data.
  const size_t data_start = static_cast<size_t>(f->tensors().front().data - bytes.data());
  for (size_t n = 0; n < bytes.size(); n += (n < data_start ? 1 : 101)) {
    auto r = gguf::File::parse(bytes.data(), n);  // reads stay inside [0, n)
    if (r.ok()) FAIL("prefix of " << n << " bytes parsed");
  }
}

TEST_CASE("hostile GGUF headers give one-line errors naming the problem", "[gguf][badinput]") {
  SECTION("bad magic") {
    Bytes x;
    x.put<uint32_t>(0x12345678).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0);
    REQUIRE_THAT(parse_error(x.b), Catch::Contains("bad magic"));
  }
  SECTION("unsupported versions") {
    for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
      Bytes x;
      x.header(0, 0, v);
      REQUIRE_THAT(parse_error(x.b), Catch::Contains("unsupported GGUF version"));
    }
  }
  SECTION("counts larger than the file") {
    Bytes a;
    a.header(1ull << 60, 0);
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("tensor count"));
    Bytes b;
    b.header(0, 0xffffffffffffull);
    REQUIRE_THAT(parse_error(b.b), Catch::Contains("metadata count"));
  }
  SECTION("key and string lengths past the end or huge") {
    Bytes a;
    a.header(0, 1).put<uint64_t>(1000).str("padding-bytes-here");
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("past the end"));
    Bytes b;
    b.header(0, 1).put<uint64_t>(~0ull).str("padding-bytes-here");
    REQUIRE_THAT(parse_error(b.b), Catch::Contains("exceeds the limit"));
    Bytes c;
    c.header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1ull << 33);
    REQUIRE_THAT(parse_error(c.b), Catch::Contains("string"));
  }
  SECTION("unknown value types") {
    Bytes a;
    a.header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("unknown value type 13"));
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0);
    REQUIRE_THAT(parse_error(b.b), Catch::Contains("unknown array element type 77"));
  }
  SECTION("array count times element size overflows or exceeds the file") {
    Bytes a;
    a.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(10).put<uint64_t>(1ull << 61);
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("array count"));
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1ull << 40);
    REQUIRE_THAT(parse_error(b.b), Catch::Contains("array count"));
  }
  SECTION("nesting too deep") {
    Bytes a;
    a.header(0, 1).str("k");
    a.put<uint32_t>(9);
    for (int i = 0; i < 6; ++i) a.put<uint32_t>(9).put<uint64_t>(1);
    a.put<uint32_t>(5).put<uint64_t>(0);
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("nested deeper"));
  }
  SECTION("alignment 0 or not a power of two") {
    for (uint32_t al : {0u, 3u, 48u}) {
      Bytes a;
      a.header(0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(al);
      REQUIRE_THAT(parse_error(a.b), Catch::Contains("power of two"));
    }
  }
  SECTION("bool that is not 0 or 1") {
    Bytes a;
    a.header(0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2);
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("bool"));
  }
  SECTION("duplicate keys") {
    Bytes a;
    a.header(0, 2).str("k").put<uint32_t>(4).put<uint32_t>(1).str("k").put<uint32_t>(4).put<uint32_t>(2);
    REQUIRE_THAT(parse_error(a.b), Catch::Contains("duplicate metadata key"));
  }
}

TEST_CASE("hostile tensor infos are rejected", "[gguf][badinput]") {
  REQUIRE(parse_error(one_tensor({32, 2}, 0, 0, 256)).empty());  // the valid baseline
  REQUIRE_THAT(parse_error(one_tensor({}, 0, 0, 0)), Catch::Contains("0 dimensions"));
  REQUIRE_THAT(parse_error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 4)), Catch::Contains("5 dimensions"));
  REQUIRE_THAT(parse_error(one_tensor({32, 0}, 0, 0, 0)), Catch::Contains("dimension 1 is 0"));
  REQUIRE_THAT(parse_error(one_tensor({1ull << 40, 1ull << 40}, 0, 0, 0)), Catch::Contains("overflows"));
  REQUIRE_THAT(parse_error(one_tensor({33, 1}, 2, 0, 64)), Catch::Contains("not a multiple"));
  REQUIRE_THAT(parse_error(one_tensor({32}, 99, 0, 64)), Catch::Contains("unsupported tensor type 99"));
  REQUIRE_THAT(parse_error(one_tensor({32, 4}, 0, 0, 64)), Catch::Contains("past the end"));
  REQUIRE_THAT(parse_error(one_tensor({8}, 0, 1ull << 62, 64)), Catch::Contains("past the end"));
  REQUIRE_THAT(parse_error(one_tensor({8}, 0, 8, 64)), Catch::Contains("not aligned"));
  {  // overlapping and duplicate tensors
    Bytes x;
    x.header(2, 0).str("a").put<uint32_t>(1).put<uint64_t>(16).put<uint32_t>(0).put<uint64_t>(0);
    x.str("b").put<uint32_t>(1).put<uint64_t>(16).put<uint32_t>(0).put<uint64_t>(32).pad();
    x.b.resize(x.b.size() + 128, 0);
    REQUIRE_THAT(parse_error(x.b), Catch::Contains("overlap"));
    Bytes y;
    y.header(2, 0).str("a").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).put<uint64_t>(0);
    y.str("a").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).put<uint64_t>(32).pad();
    y.b.resize(y.b.size() + 128, 0);
    REQUIRE_THAT(parse_error(y.b), Catch::Contains("duplicate tensor name"));
  }
}

TEST_CASE("model-level inconsistencies in a GGUF are clear errors", "[gguf][badinput][model]") {
  const std::string path = "/tmp/troupe_badmodel_" + std::to_string(::getpid()) + ".gguf";
  auto open_with = [&](auto mutate) {
    gguf::Writer w = test::tiny_model_writer();
    mutate(w);
    REQUIRE(w.write(path).ok());
    auto r = open_gguf(path);
    std::remove(path.c_str());
    return r.ok() ? std::string() : r.error().message;
  };
  REQUIRE(open_with([](gguf::Writer&) {}).empty());
  REQUIRE_THAT(open_with([](gguf::Writer& w) { w.add_u32("llama.vocab_size", 1000); }), Catch::Contains("vocabulary"));
  // A later key with the same name is a duplicate, so bad hyper-parameters need a fresh key set:
  // use an architecture name with no metadata at all.
  REQUIRE_THAT(open_with([](gguf::Writer& w) { w.add_string("general.architecture", "x"); }),
               Catch::Contains("duplicate"));
  test::TinyModelSpec s;
  s.kv_heads = 3;  // 4 query heads cannot be shared evenly by 3 KV heads
  {
    gguf::Writer w = test::tiny_model_writer(s);
    REQUIRE(w.write(path).ok());
    auto r = open_gguf(path);
    std::remove(path.c_str());
    REQUIRE_FALSE(r.ok());
    REQUIRE_THAT(r.error().message, Catch::Contains("num_kv_heads"));
  }
  s = {};
  s.arch = "gpt-j";
  {
    gguf::Writer w = test::tiny_model_writer(s);
    REQUIRE(w.write(path).ok());
    auto r = open_gguf(path);
    std::remove(path.c_str());
    REQUIRE_FALSE(r.ok());
    REQUIRE_THAT(r.error().message, Catch::Contains("unsupported architecture 'gpt-j'"));
  }
}
