// A format-neutral view of a model's tensors. Names follow GGUF's convention
// ("blk.0.attn_q.weight"); the safetensors reader renames Hugging Face names into it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace troupe {

struct TensorRef {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // shape[0] is the contiguous dimension (a row's length)
  const void* data = nullptr;
  uint64_t nbytes = 0;
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < shape.size(); ++i) r *= shape[i];
    return r;
  }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  const TensorRef* find(std::string_view name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  const std::map<std::string, TensorRef, std::less<>>& tensors() const { return tensors_; }
  void add(TensorRef t) { tensors_[t.name] = std::move(t); }
  // GGUF stores llama Q/K rows permuted for interleaved RoPE; HF files do not.
  bool is_gguf = false;

 private:
  std::map<std::string, TensorRef, std::less<>> tensors_;
};

}  // namespace troupe
