// libFuzzer target: the GGUF reader (gguf::File::parse) on arbitrary bytes.
//
// When the bytes parse, every tensor's first and last data byte and every metadata value
// (strings byte by byte, arrays element by element) is read, so AddressSanitizer checks
// that everything the parser hands out lies inside the input. The parsed file is then
// given to Tokenizer::from_gguf, which must reject hostile vocabularies with an error.
// Build and run: tests/fuzz/run.sh (see docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/format/gguf.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace troupe;

namespace {

volatile uint64_t g_sink;  // keeps the reads below from being optimized away

void touch(const gguf::Value& v, uint64_t& acc, int depth) {
  if (depth > 8) std::abort();  // the parser's nesting limit is 3: deeper is a bug
  acc += v.u + static_cast<uint64_t>(v.i) + static_cast<uint64_t>(v.f != 0);
  for (unsigned char c : v.s) acc += c;
  if (v.type == gguf::ValueType::ARRAY) {
    for (const auto& e : v.array) {
      if (e.type != v.elem_type) std::abort();  // arrays hold elements of one type
      touch(e, acc, depth + 1);
    }
  } else if (!v.array.empty()) {
    std::abort();
  }
  (void)v.as_int();
  (void)v.as_number();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libFuzzer hands over an exact-size heap buffer, so ASan flags any read past its end.
  auto r = gguf::File::parse(data, size);
  if (!r) {
    if (r.error().message.empty()) std::abort();  // every error must say something
    return 0;
  }
  const gguf::File& f = *r;
  uint64_t acc = 0;
  for (const auto& [key, value] : f.metadata()) {
    if (key.empty()) std::abort();
    if (f.find(key) != &value) std::abort();  // the index must point at the first entry
    touch(value, acc, 0);
  }
  const uint8_t* begin = data;
  const uint8_t* end = data + size;
  for (const auto& t : f.tensors()) {
    if (f.tensor(t.name) != &t) std::abort();
    if (t.n_dims < 1 || t.n_dims > 4) std::abort();
    if (t.nbytes == 0) continue;
    if (t.data < begin || t.data + t.nbytes > end) std::abort();  // explicit check, then ASan's
    acc += t.data[0];
    acc += t.data[t.nbytes - 1];
  }
  (void)f.opt_int("general.alignment");
  (void)f.opt_string("general.architecture");
  (void)f.get_number("llama.rope.freq_base");
  g_sink = acc;

  // Hostile vocabularies must come back as errors; a tokenizer that loads must work.
  auto tok = Tokenizer::from_gguf(f);
  if (tok) {
    const int32_t n = tok->vocab_size();
    if (n <= 0) std::abort();
    auto ids = tok->encode("Hello world <|im_start|> 123 \xC3\xA9", true, true);
    for (int32_t id : ids)
      if (id < 0 || id >= n) std::abort();
    ids.push_back(-1);
    ids.push_back(n);
    g_sink = tok->decode(ids, false).size() + tok->decode(ids, true).size();
  }
  return 0;
}
