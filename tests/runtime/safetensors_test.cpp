// Safetensors reader: a valid file written byte by byte, every hostile-header case of
// RELIABILITY.md (each a one-line error naming the problem), sharded indexes that try to
// leave the model directory, and truncation of a valid file at every byte.
#include "runtime/format/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

using namespace troupe;
using nlohmann::json;

namespace {

// 8-byte little-endian header length, the header, then the data section.
std::vector<uint8_t> file_bytes(const std::string& header, const std::vector<uint8_t>& data,
                                uint64_t hlen_override = 0) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  const uint64_t hlen = hlen_override ? hlen_override : header.size();
  std::memcpy(out.data(), &hlen, 8);
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return out;
}

std::vector<uint8_t> file_bytes(const json& header, const std::vector<uint8_t>& data) {
  return file_bytes(header.dump(), data);
}

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(i * 7 + 1);
  return d;
}

// A valid two-tensor file: "w" F32 [2, 3] at [0, 24), "b" BF16 [4] at [24, 32).
json valid_header() {
  return {{"__metadata__", {{"format", "pt"}}},
          {"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
          {"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {24, 32}}}}};
}

// Parses a private heap copy of exactly `size` bytes, so any read past the end is a read
// past an allocation; every tensor of a successful parse must lie inside it.
Result<std::vector<safetensors::Tensor>> parse_copy(const std::vector<uint8_t>& bytes, size_t size,
                                                    std::vector<uint8_t>& keep) {
  keep.assign(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size));
  keep.shrink_to_fit();
  auto r = safetensors::parse(keep.data(), keep.size());
  if (r)
    for (const auto& t : *r) {
      REQUIRE(t.data >= keep.data());
      REQUIRE(t.data + t.nbytes <= keep.data() + keep.size());
    }
  return r;
}

std::string error_of(const std::vector<uint8_t>& bytes) {
  auto r = safetensors::parse(bytes.data(), bytes.size());
  if (r) return "";
  REQUIRE_FALSE(r.error().message.empty());
  REQUIRE(r.error().message.find('\n') == std::string::npos);  // one line
  return r.error().message;
}

json tensor(const char* dtype, std::vector<uint64_t> shape, uint64_t b, uint64_t e) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("troupe_st_" + std::to_string(::getpid()) + "_" + std::to_string(++counter));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::ofstream(path / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

}  // namespace

TEST_CASE("a hand-written safetensors file parses", "[safetensors]") {
  const auto data = iota_bytes(32);
  const auto bytes = file_bytes(valid_header(), data);
  auto r = safetensors::parse(bytes.data(), bytes.size());
  if (!r) FAIL(r.error().message);
  REQUIRE(r->size() == 2);
  const safetensors::Tensor* w = nullptr;
  const safetensors::Tensor* b = nullptr;
  for (const auto& t : *r) (t.name == "w" ? w : b) = &t;
  REQUIRE(w);
  REQUIRE(b);
  CHECK(b->name == "b");
  CHECK(w->type == DType::F32);
  CHECK(w->shape == std::vector<int64_t>{2, 3});
  CHECK(w->nbytes == 24);
  const uint8_t* base = bytes.data() + bytes.size() - 32;
  CHECK(w->data == base);
  CHECK(b->type == DType::BF16);
  CHECK(b->shape == std::vector<int64_t>{4});
  CHECK(b->nbytes == 8);
  CHECK(b->data == base + 24);
  CHECK(std::memcmp(b->data, data.data() + 24, 8) == 0);

  // Header padded with spaces (as the Python writer aligns it), F16, a 0-d scalar and an
  // empty tensor.
  json h = {
      {"s", tensor("F16", {}, 0, 2)}, {"e", tensor("F32", {0, 5}, 2, 2)}, {"h", tensor("F16", {1, 1, 1, 3}, 2, 8)}};
  auto padded = file_bytes(h.dump() + "      ", iota_bytes(8));
  auto r2 = safetensors::parse(padded.data(), padded.size());
  if (!r2) FAIL(r2.error().message);
  CHECK(r2->size() == 3);
}

TEST_CASE("hostile safetensors headers give one-line errors", "[safetensors][badinput]") {
  const auto data = iota_bytes(32);
  auto with = [&](json h) { return error_of(file_bytes(h, data)); };
  auto entry_with = [&](json e) {
    json h = valid_header();
    h["w"] = std::move(e);
    return with(h);
  };
  const std::string good = valid_header().dump();

  SECTION("too short for the length") {
    CHECK_THAT(error_of({1, 2, 3}), Catch::Contains("too short"));
    CHECK_THAT(error_of({}), Catch::Contains("too short"));
  }
  SECTION("header length huge or past the file") {
    CHECK_THAT(error_of(file_bytes(good, data, ~uint64_t{0})), Catch::Contains("header length"));
    CHECK_THAT(error_of(file_bytes(good, data, uint64_t{1} << 62)), Catch::Contains("header length"));
    CHECK_THAT(error_of(file_bytes(good, data, good.size() + data.size() + 1)), Catch::Contains("header length"));
    // A header that claims more than the 100 MiB limit in a file that is large enough.
    std::vector<uint8_t> big(8 + (101u << 20), ' ');
    const uint64_t hlen = big.size() - 8;
    std::memcpy(big.data(), &hlen, 8);
    CHECK_THAT(error_of(big), Catch::Contains("header length"));
  }
  SECTION("header not JSON or not an object") {
    CHECK_THAT(error_of(file_bytes(std::string("{\"w\": "), data)), Catch::Contains("not JSON"));
    CHECK_THAT(error_of(file_bytes(std::string("\xff\xfe garbage"), data)), Catch::Contains("not JSON"));
    CHECK_THAT(error_of(file_bytes(std::string(""), data)), Catch::Contains("not JSON"));
    CHECK_THAT(error_of(file_bytes(std::string(100000, '['), data)), Catch::Contains("not JSON"));  // deep nesting
    CHECK_THAT(with(json::array({1, 2})), Catch::Contains("not a JSON object"));
    CHECK_THAT(with(json("text")), Catch::Contains("not a JSON object"));
  }
  SECTION("malformed entries") {
    CHECK_THAT(entry_with(json(5)), Catch::Contains("'w'") && Catch::Contains("malformed"));
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", {2, 3}}}), Catch::Contains("malformed"));
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0}}}), Catch::Contains("malformed"));
    CHECK_THAT(entry_with({{"dtype", 1}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}), Catch::Contains("malformed"));
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", 6}, {"data_offsets", {0, 24}}}), Catch::Contains("malformed"));
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {-1, 23}}}),
               Catch::Contains("data_offsets"));
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0.0, 24.0}}}),
               Catch::Contains("data_offsets"));
  }
  SECTION("unknown dtype") {
    CHECK_THAT(entry_with(tensor("F64", {3}, 0, 24)), Catch::Contains("unsupported dtype F64"));
    CHECK_THAT(entry_with(tensor("I8", {24}, 0, 24)), Catch::Contains("unsupported dtype I8"));
    CHECK_THAT(entry_with(tensor("", {6}, 0, 24)), Catch::Contains("unsupported dtype"));
  }
  SECTION("bad dimensions") {
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", {-2, -3}}, {"data_offsets", {0, 24}}}),
               Catch::Contains("bad dimension"));
    CHECK_THAT(entry_with({{"dtype", "F32"}, {"shape", {2.0, 3}}, {"data_offsets", {0, 24}}}),
               Catch::Contains("bad dimension"));
    CHECK_THAT(entry_with(tensor("F32", {1, 1, 2, 1, 3}, 0, 24)), Catch::Contains("more than 4 dimensions"));
    // Products that overflow 64 bits, or dimensions beyond any real file.
    CHECK_THAT(entry_with(tensor("F32", {1ull << 32, 1ull << 32, 1ull << 32}, 0, 24)), Catch::Contains("overflows"));
    CHECK_THAT(entry_with(tensor("F32", {~0ull}, 0, 24)), Catch::Contains("overflows"));
    // count * 4 overflows to a small number: must not be taken as the byte span.
    CHECK_THAT(entry_with(tensor("F32", {1ull << 31, 1ull << 31}, 0, 24)), Catch::Contains("byte span"));
  }
  SECTION("shape x dtype != byte span") {
    CHECK_THAT(entry_with(tensor("F32", {2, 3}, 0, 20)), Catch::Contains("byte span"));
    CHECK_THAT(entry_with(tensor("BF16", {2, 3}, 0, 24)), Catch::Contains("byte span"));
    CHECK_THAT(entry_with(tensor("F32", {2, 3}, 24, 0)), Catch::Contains("byte span"));  // end before begin
  }
  SECTION("offsets past the data") {
    json h = valid_header();
    h["b"] = tensor("BF16", {4}, 32, 40);
    h["w"] = tensor("F32", {2, 4}, 0, 32);
    CHECK_THAT(with(h), Catch::Contains("past the end"));
    h = valid_header();
    h["b"] = tensor("BF16", {4}, ~0ull - 4, ~0ull + 4);  // wraps: end < begin
    CHECK_FALSE(with(h).empty());
  }
  SECTION("overlapping tensors") {
    json h = valid_header();
    h["b"] = tensor("BF16", {4}, 16, 24);
    h["c"] = tensor("F32", {2}, 24, 32);
    CHECK_THAT(with(h), Catch::Contains("overlaps"));
    h = valid_header();
    h["b"] = tensor("F32", {6}, 0, 24);  // the same span twice
    h["c"] = tensor("BF16", {4}, 24, 32);
    CHECK_THAT(with(h), Catch::Contains("overlaps"));
  }
  SECTION("holes between tensors or after the last one") {
    json h = valid_header();
    h["w"] = tensor("F32", {5}, 0, 20);  // [20, 24) belongs to nobody
    CHECK_THAT(with(h), Catch::Contains("not contiguous"));
    h = valid_header();
    h["w"] = tensor("F32", {5}, 4, 24);  // [0, 4) belongs to nobody
    CHECK_THAT(with(h), Catch::Contains("not contiguous"));
    // Bytes after the last tensor: the safetensors library refuses them too.
    h = valid_header();
    h["b"] = tensor("BF16", {2}, 24, 28);
    CHECK_THAT(with(h), Catch::Contains("not contiguous"));
    CHECK_THAT(error_of(file_bytes(json::object(), data)), Catch::Contains("not contiguous"));
  }
}

TEST_CASE("a safetensors file truncated at any byte is refused without a crash", "[safetensors][badinput]") {
  const auto bytes = file_bytes(valid_header(), iota_bytes(32));
  std::vector<uint8_t> keep;
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    CHECK_FALSE(parse_copy(bytes, n, keep).ok());
  }
  CHECK(parse_copy(bytes, bytes.size(), keep).ok());
}

TEST_CASE("single-byte corruptions of a safetensors file never escape the buffer", "[safetensors][badinput]") {
  const auto bytes = file_bytes(valid_header(), iota_bytes(32));
  const size_t header_end = bytes.size() - 32;
  std::vector<uint8_t> keep;
  size_t num_ok = 0;
  for (size_t i = 0; i < header_end; ++i)
    for (uint8_t v : {uint8_t{0}, uint8_t{'9'}, uint8_t{'"'}, uint8_t{'['}, uint8_t{0xff}}) {
      auto b = bytes;
      b[i] = v;
      auto r = parse_copy(b, b.size(), keep);  // checks spans when it parses
      num_ok += r.ok();
    }
  // Most corruptions are refused; a few (inside the metadata strings) are harmless.
  CHECK(num_ok < header_end);
}

TEST_CASE("sharded safetensors: the index stays inside the model directory", "[safetensors][badinput]") {
  const auto shard_a = file_bytes(json{{"a", tensor("F32", {2}, 0, 8)}}, iota_bytes(8));
  const auto shard_b = file_bytes(json{{"b", tensor("F32", {3}, 0, 12)}}, iota_bytes(12));

  SECTION("a valid index opens every shard") {
    TempDir d;
    d.write("s1.safetensors", shard_a);
    d.write("s2.safetensors", shard_b);
    d.write("model.safetensors.index.json",
            json{{"metadata", {{"total_size", 20}}}, {"weight_map", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}}}
                .dump());
    auto s = safetensors::Shards::open_dir(d.path.string());
    if (!s) FAIL(s.error().message);
    REQUIRE(s->tensors().size() == 2);
    int64_t elems = 0;
    for (const auto& t : s->tensors()) elems += t.shape[0];
    CHECK(elems == 5);
  }
  SECTION("weight_map entries that leave the directory are refused before any open") {
    // A directory inside the model dir, and a valid file one level up, so a reader that
    // followed the path would succeed.
    TempDir d;
    d.write("s1.safetensors", shard_a);
    std::filesystem::create_directories(d.path / "a");
    d.write("a/b", shard_b);
    const std::string escape = "troupe_st_escape_" + std::to_string(::getpid()) + ".safetensors";
    d.write("../" + escape, shard_b);
    const std::vector<std::string> bad_names = {
        "../" + escape, "/etc/passwd", "a/b", "..", ".", "", "a\\b", (d.path / "s1.safetensors").string()};
    for (const std::string& bad : bad_names) {
      d.write("model.safetensors.index.json", json{{"weight_map", {{"a", "s1.safetensors"}, {"b", bad}}}}.dump());
      auto s = safetensors::Shards::open_dir(d.path.string());
      INFO("weight_map file '" << bad << "'");
      REQUIRE_FALSE(s.ok());
      CHECK_THAT(s.error().message, Catch::Contains("outside the model directory"));
    }
    std::filesystem::remove(d.path.parent_path() / escape);
  }
  SECTION("a tensor in two shards is refused") {
    TempDir d;
    d.write("s1.safetensors", shard_a);
    d.write("s2.safetensors", file_bytes(json{{"a", tensor("F32", {2}, 0, 8)}}, iota_bytes(8)));
    d.write("model.safetensors.index.json",
            json{{"weight_map", {{"a", "s1.safetensors"}, {"x", "s2.safetensors"}}}}.dump());
    auto s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("'a'") && Catch::Contains("two shards"));
  }
  SECTION("bad index files and bad shards") {
    TempDir d;
    d.write("model.safetensors.index.json", std::string("{not json"));
    auto s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("not JSON"));
    d.write("model.safetensors.index.json", json{{"weight_map", {{"a", 3}}}}.dump());
    s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("not a file name"));
    d.write("model.safetensors.index.json", json{{"weight_map", json::array()}}.dump());
    s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("weight_map"));
    d.write("model.safetensors.index.json", json{{"weight_map", {{"a", "missing.safetensors"}}}}.dump());
    s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("missing.safetensors"));
    // A broken shard names the shard.
    d.write("bad.safetensors", std::vector<uint8_t>{1, 2, 3});
    d.write("model.safetensors.index.json", json{{"weight_map", {{"a", "bad.safetensors"}}}}.dump());
    s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("bad.safetensors") && Catch::Contains("too short"));
  }
  SECTION("no index and no model.safetensors") {
    TempDir d;
    auto s = safetensors::Shards::open_dir(d.path.string());
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error().message, Catch::Contains("model.safetensors"));
  }
}
