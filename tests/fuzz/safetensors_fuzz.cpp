// libFuzzer target: the safetensors reader (safetensors::parse) on arbitrary bytes: the
// 8-byte header length, the JSON header and every tensor entry (dtype, shape, offsets).
// When the bytes parse, every tensor's first and last data byte is read so ASan checks
// the spans, and the spans are checked to tile the data section in order.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/format/safetensors.h"

using namespace troupe;

namespace {
volatile uint64_t g_sink;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = safetensors::parse(data, size);
  if (!r) {
    if (r.error().message.empty()) std::abort();
    return 0;
  }
  uint64_t hlen = 0;
  if (size < 8) std::abort();
  std::memcpy(&hlen, data, 8);
  const uint8_t* base = data + 8 + hlen;
  const uint8_t* end = data + size;
  uint64_t acc = 0;
  std::vector<const safetensors::Tensor*> order;
  for (const auto& t : *r) {
    if (t.shape.size() > 4) std::abort();
    for (int64_t d : t.shape)
      if (d < 0) std::abort();
    if (t.data < base || t.data > end || t.nbytes > static_cast<uint64_t>(end - t.data)) std::abort();
    if (t.nbytes > 0) {
      acc += t.data[0];
      acc += t.data[t.nbytes - 1];
    }
    acc += t.name.size();
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->data < b->data; });
  const uint8_t* expect = base;
  for (auto* t : order) {
    if (t->data != expect) std::abort();  // the parser promises no overlaps and no holes
    expect = t->data + t->nbytes;
  }
  g_sink = acc;
  return 0;
}
