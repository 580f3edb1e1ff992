// Greedy decoding through SequenceRunner (host argmax over each step's logits), shared by
// the model tests that compare backends or files token by token.
#pragma once
#include <catch2/catch.hpp>
#include <algorithm>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/engine/sequence_runner.h"

namespace troupe::test {

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<float> first_logits;
};

inline Greedy greedy(Model& m, Backend& be, const std::vector<int32_t>& prompt, int n) {
  auto r = SequenceRunner::create(m, be, std::min(1024, m.config().max_context));
  if (!r) FAIL(r.error().message);
  auto l = (*r)->feed(prompt);
  if (!l) FAIL(be.name() << ": " << l.error().message);
  Greedy g;
  g.first_logits.assign(*l, *l + m.config().vocab);
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(*l, *l + m.config().vocab) - *l);
    g.tokens.push_back(t);
    if (i + 1 < n) {
      l = (*r)->feed({t});
      if (!l) FAIL(be.name() << ": " << l.error().message);
    }
  }
  return g;
}

inline size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace troupe::test
