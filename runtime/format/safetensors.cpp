#include "runtime/format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace troupe::safetensors {

Result<std::vector<Tensor>> parse(const uint8_t* data, size_t size) {
  if (size < 8) return make_error("safetensors: file of " + std::to_string(size) + " bytes is too short for a header");
  uint64_t hlen;
  std::memcpy(&hlen, data, 8);
  if (hlen > size - 8)
    return make_error("safetensors: header length " + std::to_string(hlen) + " runs past the end of the " +
                      std::to_string(size) + "-byte file");
  if (hlen > (100ull << 20))
    return make_error("safetensors: header length " + std::to_string(hlen) + " is over the 100 MiB limit");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(data + 8, data + 8 + hlen);
  } catch (const std::exception& e) { return make_error(std::string("safetensors: header is not JSON: ") + e.what()); }
  if (!h.is_object()) return make_error("safetensors: header is not a JSON object");
  const uint64_t data_size = size - 8 - hlen;
  const uint8_t* base = data + 8 + hlen;
  std::vector<Tensor> out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    const std::string& name = it.key();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      return make_error("safetensors: tensor '" + name + "' has a malformed entry");
    Tensor t;
    t.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    uint64_t esize;
    if (dt == "F32") {
      t.type = DType::F32;
      esize = 4;
    } else if (dt == "F16") {
      t.type = DType::F16;
      esize = 2;
    } else if (dt == "BF16") {
      t.type = DType::BF16;
      esize = 2;
    } else
      return make_error("safetensors: tensor '" + name + "' has unsupported dtype " + dt);
    uint64_t count = 1;
    if (v["shape"].size() > 4) return make_error("safetensors: tensor '" + name + "' has more than 4 dimensions");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) return make_error("safetensors: tensor '" + name + "' has a bad dimension");
      const uint64_t n = d.get<uint64_t>();
      if (n > (1ull << 40) || __builtin_mul_overflow(count, n, &count))
        return make_error("safetensors: tensor '" + name + "' shape overflows");
      t.shape.push_back(static_cast<int64_t>(n));
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return make_error("safetensors: tensor '" + name + "' has bad data_offsets");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    uint64_t bytes;
    if (__builtin_mul_overflow(count, esize, &bytes) || e < b || e - b != bytes)
      return make_error("safetensors: tensor '" + name + "' shape x dtype is not its byte span [" + std::to_string(b) +
                        ", " + std::to_string(e) + ")");
    if (e > data_size)
      return make_error("safetensors: tensor '" + name + "' data ends at " + std::to_string(e) +
                        ", past the end of the data (" + std::to_string(data_size) + " bytes)");
    t.data = base + b;
    t.nbytes = bytes;
    out.push_back(std::move(t));
  }
  // Offsets must tile the data without overlaps or holes, to its last byte (as the
  // safetensors library checks). Sorted by (begin, end) like the library, so an empty
  // tensor at the offset where another one starts is not taken for an overlap.
  std::vector<const Tensor*> order;
  for (const auto& t : out) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](auto* a, auto* b) { return a->data < b->data || (a->data == b->data && a->nbytes < b->nbytes); });
  const uint8_t* expect = base;
  for (const Tensor* t : order) {
    if (t->data < expect) return make_error("safetensors: tensor '" + t->name + "' overlaps another tensor");
    if (t->data > expect) return make_error("safetensors: tensor data is not contiguous before '" + t->name + "'");
    expect = t->data + t->nbytes;
  }
  if (expect != base + data_size)
    return make_error("safetensors: tensor data is not contiguous: " + std::to_string(base + data_size - expect) +
                      " bytes after the last tensor belong to none");
  return out;
}

Result<Shards> Shards::open_dir(const std::string& dir) {
  Shards s;
  std::vector<std::string> files;
  std::ifstream idx(dir + "/model.safetensors.index.json");
  if (idx) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(idx);
    } catch (const std::exception& e) {
      return make_error("model.safetensors.index.json is not JSON: " + std::string(e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return make_error("model.safetensors.index.json has no weight_map");
    std::set<std::string> uniq;
    for (auto& [k, v] : j["weight_map"].items()) {
      if (!v.is_string()) return make_error("weight_map entry '" + k + "' is not a file name");
      const std::string f = v.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == "..")
        return make_error("weight_map entry '" + k + "' points outside the model directory: '" + f + "'");
      uniq.insert(f);
    }
    files.assign(uniq.begin(), uniq.end());
  } else {
    files.push_back("model.safetensors");
  }
  std::set<std::string> names;
  for (const auto& f : files) {
    auto m = MappedFile::open(dir + "/" + f);
    if (!m) return m.error();
    auto map = std::make_shared<MappedFile>(std::move(*m));
    auto ts = parse(map->data(), map->size());
    if (!ts) return make_error(f + ": " + ts.error().message);
    for (auto& t : *ts) {
      if (!names.insert(t.name).second) return make_error("tensor '" + t.name + "' appears in two shards");
      s.tensors_.push_back(std::move(t));
    }
    s.maps_.push_back(std::move(map));
  }
  return s;
}

}  // namespace troupe::safetensors
