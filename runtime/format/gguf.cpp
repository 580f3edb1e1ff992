#include "runtime/format/gguf.h"

#include <algorithm>
#include <cstring>
#include <fstream>

namespace troupe::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "?";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::U16:
    case ValueType::I16:
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::BOOL:
      return true;
    default:
      return false;
  }
}

std::optional<int64_t> Value::as_int() const {
  switch (type) {
    case ValueType::U8:
    case ValueType::U16:
    case ValueType::U32:
    case ValueType::U64:
    case ValueType::BOOL:
      if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<int64_t>(u);
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      return i;
    default:
      return std::nullopt;
  }
}

std::optional<double> Value::as_number() const {
  if (is_float()) return f;
  if (auto v = as_int()) return static_cast<double>(*v);
  return std::nullopt;
}

namespace {
// Size in bytes of a fixed-size scalar; 0 for string/array.
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    default:
      return 0;
  }
}
bool valid_value_type(uint32_t t) { return t <= 12; }
}  // namespace

// Cursor over the file bytes; every read is bounds-checked.
class Parser {
 public:
  Parser(const uint8_t* data, size_t size, const Limits& limits) : p_(data), size_(size), limits_(limits) {}

  Result<File> run(std::shared_ptr<MappedFile> map);

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const Limits& limits_;

  uint64_t remaining() const { return size_ - pos_; }

  template <typename T>
  Result<T> read(const char* what) {
    if (remaining() < sizeof(T))
      return make_error(std::string("truncated file: ") + what + " at byte " + std::to_string(pos_) + " needs " +
                        std::to_string(sizeof(T)) + " bytes, " + std::to_string(remaining()) + " left");
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> read_string(const std::string& what) {
    auto len = read<uint64_t>((what + " length").c_str());
    if (!len) return len.error();
    if (*len > limits_.max_string_bytes)
      return make_error(what + " length " + std::to_string(*len) + " exceeds the limit of " +
                        std::to_string(limits_.max_string_bytes) + " bytes");
    if (*len > remaining())
      return make_error(what + " length " + std::to_string(*len) + " runs past the end of the file (" +
                        std::to_string(remaining()) + " bytes left)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(*len));
    pos_ += static_cast<size_t>(*len);
    return s;
  }

  Result<Value> read_value(ValueType t, const std::string& key, uint32_t depth);
};

Result<Value> Parser::read_value(ValueType t, const std::string& key, uint32_t depth) {
  Value v;
  v.type = t;
  switch (t) {
    case ValueType::U8: {
      auto r = read<uint8_t>("u8 value");
      if (!r) return r.error();
      v.u = *r;
      break;
    }
    case ValueType::I8: {
      auto r = read<int8_t>("i8 value");
      if (!r) return r.error();
      v.i = *r;
      break;
    }
    case ValueType::U16: {
      auto r = read<uint16_t>("u16 value");
      if (!r) return r.error();
      v.u = *r;
      break;
    }
    case ValueType::I16: {
      auto r = read<int16_t>("i16 value");
      if (!r) return r.error();
      v.i = *r;
      break;
    }
    case ValueType::U32: {
      auto r = read<uint32_t>("u32 value");
      if (!r) return r.error();
      v.u = *r;
      break;
    }
    case ValueType::I32: {
      auto r = read<int32_t>("i32 value");
      if (!r) return r.error();
      v.i = *r;
      break;
    }
    case ValueType::U64: {
      auto r = read<uint64_t>("u64 value");
      if (!r) return r.error();
      v.u = *r;
      break;
    }
    case ValueType::I64: {
      auto r = read<int64_t>("i64 value");
      if (!r) return r.error();
      v.i = *r;
      break;
    }
    case ValueType::F32: {
      auto r = read<float>("f32 value");
      if (!r) return r.error();
      v.f = *r;
      break;
    }
    case ValueType::F64: {
      auto r = read<double>("f64 value");
      if (!r) return r.error();
      v.f = *r;
      break;
    }
    case ValueType::BOOL: {
      auto r = read<uint8_t>("bool value");
      if (!r) return r.error();
      if (*r > 1) return make_error("metadata '" + key + "': bool value " + std::to_string(*r) + " is not 0 or 1");
      v.u = *r;
      break;
    }
    case ValueType::STRING: {
      auto r = read_string("metadata '" + key + "' string");
      if (!r) return r.error();
      v.s = std::move(*r);
      break;
    }
    case ValueType::ARRAY: {
      if (depth >= limits_.max_nesting)
        return make_error("metadata '" + key + "': arrays nested deeper than " + std::to_string(limits_.max_nesting));
      auto et = read<uint32_t>("array element type");
      if (!et) return et.error();
      if (!valid_value_type(*et))
        return make_error("metadata '" + key + "': unknown array element type " + std::to_string(*et));
      auto count = read<uint64_t>("array count");
      if (!count) return count.error();
      v.elem_type = static_cast<ValueType>(*et);
      // Every element takes at least this many bytes, which bounds the count by the file.
      uint64_t min_elem = scalar_size(v.elem_type);
      if (min_elem == 0) min_elem = v.elem_type == ValueType::STRING ? 8 : 12;
      if (*count > remaining() / min_elem)
        return make_error("metadata '" + key + "': array count " + std::to_string(*count) + " of " +
                          std::string(value_type_name(v.elem_type)) + " cannot fit in the " +
                          std::to_string(remaining()) + " bytes left");
      v.array.reserve(static_cast<size_t>(*count));
      for (uint64_t k = 0; k < *count; ++k) {
        auto e = read_value(v.elem_type, key, depth + 1);
        if (!e) return e.error();
        v.array.push_back(std::move(*e));
      }
      break;
    }
  }
  return v;
}

Result<File> Parser::run(std::shared_ptr<MappedFile> map) {
  File file;
  file.map_ = std::move(map);
  auto magic = read<uint32_t>("magic");
  if (!magic) return magic.error();
  if (*magic != 0x46554747u) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", *magic);
    return make_error(std::string("bad magic ") + buf + " (not a GGUF file)");
  }
  auto version = read<uint32_t>("version");
  if (!version) return version.error();
  if (*version != 2 && *version != 3)
    return make_error("unsupported GGUF version " + std::to_string(*version) + " (2 and 3 are supported)");
  file.version_ = *version;
  auto n_tensors = read<uint64_t>("tensor count");
  if (!n_tensors) return n_tensors.error();
  auto n_kv = read<uint64_t>("metadata count");
  if (!n_kv) return n_kv.error();
  // A key-value pair takes at least 8 + 4 + 1 bytes; a tensor info at least 8 + 4 + 8 + 4 + 8.
  if (*n_kv > limits_.max_kv || *n_kv > remaining() / 13)
    return make_error("metadata count " + std::to_string(*n_kv) + " is larger than the file could hold");
  if (*n_tensors > limits_.max_tensors || *n_tensors > remaining() / 32)
    return make_error("tensor count " + std::to_string(*n_tensors) + " is larger than the file could hold");

  for (uint64_t k = 0; k < *n_kv; ++k) {
    auto key = read_string("metadata key #" + std::to_string(k));
    if (!key) return key.error();
    if (key->empty()) return make_error("metadata key #" + std::to_string(k) + " is empty");
    auto t = read<uint32_t>("metadata value type");
    if (!t) return t.error();
    if (!valid_value_type(*t)) return make_error("metadata '" + *key + "': unknown value type " + std::to_string(*t));
    auto v = read_value(static_cast<ValueType>(*t), *key, 0);
    if (!v) return v.error();
    if (file.kv_index_.count(*key)) return make_error("duplicate metadata key '" + *key + "'");
    file.kv_index_.emplace(*key, file.kv_.size());
    file.kv_.emplace_back(std::move(*key), std::move(*v));
  }

  if (const Value* a = file.find("general.alignment")) {
    auto av = a->as_int();
    if (!av || *av <= 0 || *av > (1 << 30) || (*av & (*av - 1)) != 0)
      return make_error("general.alignment " + (av ? std::to_string(*av) : std::string("(not an integer)")) +
                        " is not a positive power of two");
    file.alignment_ = static_cast<uint32_t>(*av);
  }

  file.tensors_.reserve(static_cast<size_t>(*n_tensors));
  for (uint64_t k = 0; k < *n_tensors; ++k) {
    TensorInfo ti;
    auto name = read_string("tensor #" + std::to_string(k) + " name");
    if (!name) return name.error();
    ti.name = std::move(*name);
    auto nd = read<uint32_t>("tensor dimension count");
    if (!nd) return nd.error();
    if (*nd == 0 || *nd > 4)
      return make_error("tensor '" + ti.name + "': " + std::to_string(*nd) + " dimensions (1 to 4 supported)");
    ti.n_dims = *nd;
    uint64_t count = 1;
    for (uint32_t d = 0; d < *nd; ++d) {
      auto ne = read<uint64_t>("tensor dimension");
      if (!ne) return ne.error();
      if (*ne == 0 || *ne > (1ull << 40))
        return make_error("tensor '" + ti.name + "': dimension " + std::to_string(d) + " is " + std::to_string(*ne));
      if (__builtin_mul_overflow(count, *ne, &count) || count > (1ull << 42))
        return make_error("tensor '" + ti.name + "': element count overflows");
      ti.ne[d] = *ne;
    }
    auto type = read<uint32_t>("tensor type");
    if (!type) return type.error();
    auto dt = dtype_from_ggml(*type);
    if (!dt || *dt == DType::Q8_1 || *dt == DType::Q8_K)
      return make_error("tensor '" + ti.name + "': unsupported tensor type " + std::to_string(*type));
    ti.type = *dt;
    const auto& tr = dtype_traits(ti.type);
    if (ti.ne[0] % tr.block_size != 0)
      return make_error("tensor '" + ti.name + "': first dimension " + std::to_string(ti.ne[0]) +
                        " is not a multiple of the " + std::string(tr.name) + " block size " +
                        std::to_string(tr.block_size));
    uint64_t rows = count / ti.ne[0];
    uint64_t rb = ti.ne[0] / tr.block_size * tr.type_size;
    if (__builtin_mul_overflow(rb, rows, &ti.nbytes))
      return make_error("tensor '" + ti.name + "': byte size overflows");
    auto off = read<uint64_t>("tensor offset");
    if (!off) return off.error();
    ti.offset = *off;
    if (ti.offset % file.alignment_ != 0)
      return make_error("tensor '" + ti.name + "': offset " + std::to_string(ti.offset) + " is not aligned to " +
                        std::to_string(file.alignment_));
    if (file.tensor_index_.count(ti.name)) return make_error("duplicate tensor name '" + ti.name + "'");
    file.tensor_index_.emplace(ti.name, file.tensors_.size());
    file.tensors_.push_back(std::move(ti));
  }

  uint64_t data_start = (pos_ + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  if (!file.tensors_.empty() && data_start > size_)
    return make_error("truncated file: the tensor data section would start at byte " + std::to_string(data_start) +
                      " of a " + std::to_string(size_) + "-byte file");
  uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
  // Offsets must lie inside the data section and must not overlap.
  std::vector<const TensorInfo*> by_offset;
  for (auto& t : file.tensors_) {
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.nbytes, &end) || end > data_size)
      return make_error("tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", +" +
                        std::to_string(t.nbytes) + ") runs past the end of the file (data section is " +
                        std::to_string(data_size) + " bytes)");
    t.data = p_ + data_start + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k)
    if (by_offset[k - 1]->offset + by_offset[k - 1]->nbytes > by_offset[k]->offset)
      return make_error("tensors '" + by_offset[k - 1]->name + "' and '" + by_offset[k]->name + "' overlap");
  return file;
}

Result<File> File::open(const std::string& path, const Limits& limits) {
  auto m = MappedFile::open(path);
  if (!m) return m.error();
  auto map = std::make_shared<MappedFile>(std::move(*m));
  Parser p(map->data(), map->size(), limits);
  auto r = p.run(map);
  if (!r) return make_error(path + ": " + r.error().message);
  return r;
}

Result<File> File::parse(const uint8_t* data, size_t size, const Limits& limits) {
  Parser p(data, size, limits);
  return p.run(nullptr);
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return make_error("missing metadata '" + std::string(key) + "'");
  auto r = v->as_int();
  if (!r)
    return make_error("metadata '" + std::string(key) + "' is " + std::string(value_type_name(v->type)) +
                      ", expected an integer");
  return *r;
}
Result<double> File::get_number(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return make_error("missing metadata '" + std::string(key) + "'");
  auto r = v->as_number();
  if (!r) return make_error("metadata '" + std::string(key) + "' is not a number");
  return *r;
}
Result<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return make_error("missing metadata '" + std::string(key) + "'");
  if (v->type != ValueType::STRING) return make_error("metadata '" + std::string(key) + "' is not a string");
  return v->s;
}
std::optional<int64_t> File::opt_int(std::string_view key) const {
  const Value* v = find(key);
  return v ? v->as_int() : std::nullopt;
}
std::optional<double> File::opt_number(std::string_view key) const {
  const Value* v = find(key);
  return v ? v->as_number() : std::nullopt;
}
std::optional<std::string> File::opt_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::STRING) return std::nullopt;
  return v->s;
}
std::optional<bool> File::opt_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v || v->type != ValueType::BOOL) return std::nullopt;
  return v->u != 0;
}

// ---- Writer ----
namespace {
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), b, b + sizeof(T));
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}
}  // namespace

void Writer::add_u32(const std::string& key, uint32_t v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 4);
  put(kv_bytes_, v);
  ++num_kv_;
}
void Writer::add_i32(const std::string& key, int32_t v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 5);
  put(kv_bytes_, v);
  ++num_kv_;
}
void Writer::add_f32(const std::string& key, float v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 6);
  put(kv_bytes_, v);
  ++num_kv_;
}
void Writer::add_bool(const std::string& key, bool v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 7);
  put<uint8_t>(kv_bytes_, v ? 1 : 0);
  ++num_kv_;
}
void Writer::add_string(const std::string& key, const std::string& v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 8);
  put_str(kv_bytes_, v);
  ++num_kv_;
}
void Writer::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 9);
  put<uint32_t>(kv_bytes_, 8);
  put<uint64_t>(kv_bytes_, v.size());
  for (const auto& s : v) put_str(kv_bytes_, s);
  ++num_kv_;
}
void Writer::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 9);
  put<uint32_t>(kv_bytes_, 5);
  put<uint64_t>(kv_bytes_, v.size());
  for (auto x : v) put(kv_bytes_, x);
  ++num_kv_;
}
void Writer::add_f32_array(const std::string& key, const std::vector<float>& v) {
  put_str(kv_bytes_, key);
  put<uint32_t>(kv_bytes_, 9);
  put<uint32_t>(kv_bytes_, 6);
  put<uint64_t>(kv_bytes_, v.size());
  for (auto x : v) put(kv_bytes_, x);
  ++num_kv_;
}
void Writer::add_tensor(const std::string& name, DType type, std::vector<uint64_t> ne, std::vector<uint8_t> data) {
  tensors_.push_back({name, type, std::move(ne), std::move(data)});
}

std::vector<uint8_t> Writer::bytes(uint32_t alignment) const {
  std::vector<uint8_t> out;
  put<uint32_t>(out, 0x46554747u);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, num_kv_ + (alignment != 32 ? 1 : 0));
  out.insert(out.end(), kv_bytes_.begin(), kv_bytes_.end());
  if (alignment != 32) {
    put_str(out, "general.alignment");
    put<uint32_t>(out, 4);
    put<uint32_t>(out, alignment);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_str(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (auto n : t.ne) put<uint64_t>(out, n);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
  for (const auto& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
  }
  return out;
}

Status Writer::write(const std::string& path, uint32_t alignment) const {
  auto b = bytes(alignment);
  std::ofstream f(path, std::ios::binary);
  if (!f) return make_error("cannot write '" + path + "'");
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) return make_error("write to '" + path + "' failed");
  return {};
}

}  // namespace troupe::gguf
