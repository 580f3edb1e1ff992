// A safetensors file as the Python writer lays it out: an 8-byte header length, the JSON
// header (padded with spaces to 8 bytes), then the tensors' bytes back to back. For the
// tests that build Hugging Face directories.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::test {

class SafetensorsWriter {
 public:
  // dtype as safetensors names it ("F32", "BF16", ...); shape row-major, outermost first.
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape, const uint8_t* bytes,
           size_t n) {
    const size_t off = data_.size();
    data_.insert(data_.end(), bytes, bytes + n);
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {off, data_.size()}}};
  }
  bool write(const std::filesystem::path& path) const {
    std::string hs = header_.dump();
    hs.append((8 - hs.size() % 8) % 8, ' ');
    const uint64_t hlen = hs.size();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(&hlen), 8);
    f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    f.write(reinterpret_cast<const char*>(data_.data()), static_cast<std::streamsize>(data_.size()));
    return static_cast<bool>(f);
  }

 private:
  nlohmann::json header_ = {{"__metadata__", {{"format", "pt"}}}};
  std::vector<uint8_t> data_;
};

}  // namespace troupe::test
