// GGUF v2/v3 reader over an mmap (or any caller-owned byte span) and a small writer.
//
// Every count, length, offset, dimension and type read from the file is checked with
// overflow-safe arithmetic before it is used; a bad file yields one error line naming the
// field and the value. Nothing is allocated in proportion to a count before that count has
// been bounded by the bytes that remain in the file.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/result.h"
#include "runtime/format/mapped_file.h"

namespace troupe::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Scalars keep their declared type; arrays hold elements of one type.
struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;                       // unsigned ints, bool
  int64_t i = 0;                        // signed ints
  double f = 0;                         // floats
  std::string s;                        // strings
  ValueType elem_type = ValueType::U8;  // arrays only
  std::vector<Value> array;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
  std::optional<int64_t> as_int() const;    // any integer type (or bool) that fits
  std::optional<double> as_number() const;  // integers and floats
};

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;                     // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;
  uint64_t num_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

struct Limits {
  uint64_t max_string_bytes = 64ull << 20;
  uint32_t max_nesting = 3;
  uint64_t max_tensors = 1u << 20;
  uint64_t max_kv = 1u << 20;
};

class File {
 public:
  // Opens and validates a file on disk (kept mapped for the File's lifetime).
  static Result<File> open(const std::string& path, const Limits& limits = {});
  // Parses caller-owned bytes that must outlive the File (tests, fuzzing).
  static Result<File> parse(const uint8_t* data, size_t size, const Limits& limits = {});

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;

  // Typed getters with errors that name the key.
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_number(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> opt_int(std::string_view key) const;
  std::optional<double> opt_number(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;
  std::optional<bool> opt_bool(std::string_view key) const;

 private:
  std::shared_ptr<MappedFile> map_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  friend class Parser;
};

// Builds GGUF v3 files: used by the tests to make tiny synthetic models and hostile files.
class Writer {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  // `data` must hold exactly row_bytes(type, ne[0]) * rows bytes.
  void add_tensor(const std::string& name, DType type, std::vector<uint64_t> ne, std::vector<uint8_t> data);
  std::vector<uint8_t> bytes(uint32_t alignment = 32) const;
  Status write(const std::string& path, uint32_t alignment = 32) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<uint8_t> kv_bytes_;
  uint64_t num_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace troupe::gguf
