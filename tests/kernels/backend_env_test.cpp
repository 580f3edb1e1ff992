// The backends' environment variables (docs/flags.md): a value a variable does not take is
// an error naming the variable, its value and what it takes, not silently the default.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "kernels/backend.h"
#include "tests/test_util.h"

using namespace troupe;

using test::EnvScope;

TEST_CASE("TROUPE_CUDA_* values are parsed strictly", "[kernels][env]") {
  EnvScope a("TROUPE_CUDA_GEMV", nullptr), b("TROUPE_CUDA_ATTN", nullptr), c("TROUPE_CUDA_FUSE", nullptr),
      d("TROUPE_CUDA_Q8_MMA", nullptr);
  SECTION("unset: the defaults") {
    auto o = cuda_env_options();
    REQUIRE(o.ok());
    CHECK_FALSE(o->simple_gemv);
    CHECK_FALSE(o->direct_k);
    CHECK(o->fuse);
    CHECK(o->q8_mma_min == 0);
  }
  SECTION("every value each takes") {
    EnvScope e1("TROUPE_CUDA_GEMV", "simple"), e2("TROUPE_CUDA_ATTN", "direct"), e3("TROUPE_CUDA_FUSE", "0"),
        e4("TROUPE_CUDA_Q8_MMA", "64");
    auto o = cuda_env_options();
    REQUIRE(o.ok());
    CHECK(o->simple_gemv);
    CHECK(o->direct_k);
    CHECK_FALSE(o->fuse);
    CHECK(o->q8_mma_min == 64);
    EnvScope f1("TROUPE_CUDA_GEMV", "auto"), f2("TROUPE_CUDA_ATTN", "staged"), f3("TROUPE_CUDA_FUSE", "1"),
        f4("TROUPE_CUDA_Q8_MMA", "0");
    auto p = cuda_env_options();
    REQUIRE(p.ok());
    CHECK_FALSE(p->simple_gemv);
    CHECK_FALSE(p->direct_k);
    CHECK(p->fuse);
    CHECK(p->q8_mma_min == 0);
    CHECK_FALSE(p->tc_attention);
    EnvScope t("TROUPE_CUDA_ATTN", "tc");
    auto tc = cuda_env_options();
    REQUIRE(tc.ok());
    CHECK(tc->tc_attention);
    CHECK_FALSE(tc->direct_k);
    CHECK_FALSE(tc->wmma_attention);
    {
      EnvScope w("TROUPE_CUDA_ATTN", "wmma");
      auto wm = cuda_env_options();
      REQUIRE(wm.ok());
      CHECK(wm->wmma_attention);
      CHECK(wm->tc_attention);  // (as tc, on the WMMA kernels)
    }
    EnvScope g("TROUPE_CUDA_FUSE", "");  // empty: as unset
    auto q = cuda_env_options();
    REQUIRE(q.ok());
    CHECK(q->fuse);
  }
  struct Bad {
    const char* name;
    const char* value;
    const char* takes;
  };
  for (const Bad& bad :
       {Bad{"TROUPE_CUDA_GEMV", "Simple", "one of simple, auto"},
        Bad{"TROUPE_CUDA_ATTN", "direkt", "one of direct, staged, tc, wmma"},
        Bad{"TROUPE_CUDA_FUSE", "false", "one of 0, 1"}, Bad{"TROUPE_CUDA_Q8_MMA", "64 tokens", "a token count"},
        Bad{"TROUPE_CUDA_Q8_MMA", "-1", "a token count"},
        Bad{"TROUPE_CUDA_Q8_MMA", "99999999999999999999", "a token count"}}) {
    DYNAMIC_SECTION(bad.name << "=" << bad.value) {
      EnvScope e(bad.name, bad.value);
      auto o = cuda_env_options();
      REQUIRE_FALSE(o.ok());
      const std::string& msg = o.error().message;
      INFO(msg);
      CHECK(msg.find(std::string(bad.name) + "='" + bad.value + "'") != std::string::npos);
      CHECK(msg.find(bad.takes) != std::string::npos);
    }
  }
}

TEST_CASE("TROUPE_CPU_ISA: a value it does not take stops --device cpu with the reason", "[kernels][env]") {
  {
    EnvScope e("TROUPE_CPU_ISA", "avx3");
    auto r = make_backend("cpu", 1);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("TROUPE_CPU_ISA='avx3'") != std::string::npos);
    CHECK(r.error().message.find("scalar, avx2, avx512") != std::string::npos);
  }
  for (const char* ok : {"scalar", "avx2", "avx512", ""}) {
    EnvScope e("TROUPE_CPU_ISA", ok);
    CHECK(check_cpu_isa_env().ok());
  }
  EnvScope e("TROUPE_CPU_ISA", nullptr);
  CHECK(make_backend("cpu", 1).ok());
}
