// Safetensors reader (single file or a sharded index) over mmap, with every header field
// validated: header length, JSON, dtype, shape x dtype = byte span, offsets inside the data,
// no overlaps or holes, shard names inside the model directory.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "runtime/format/mapped_file.h"
#include "runtime/format/weights.h"

namespace troupe::safetensors {

struct Tensor {
  std::string name;
  DType type;
  std::vector<int64_t> shape;  // as stored (row-major, last dimension contiguous)
  const uint8_t* data;
  uint64_t nbytes;
};

// Parses caller-owned bytes (tests, fuzzing). Tensors point into `data`.
Result<std::vector<Tensor>> parse(const uint8_t* data, size_t size);

class Shards {
 public:
  // Opens `dir/model.safetensors` or every shard listed by `dir/model.safetensors.index.json`.
  static Result<Shards> open_dir(const std::string& dir);
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<std::shared_ptr<MappedFile>> maps_;
  std::vector<Tensor> tensors_;
};

}  // namespace troupe::safetensors
