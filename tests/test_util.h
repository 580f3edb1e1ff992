// Helpers shared by the Catch2 tests.
#pragma once
#include <cstdlib>
#include <string>
#include <sys/stat.h>

namespace troupe::test {

// Sets one environment variable for a scope (unsets it when value is null) and restores
// what was there when the scope ends, also when a REQUIRE throws out of it.
struct EnvScope {
  std::string name, old;
  bool had;
  EnvScope(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (value)
      setenv(n, value, 1);
    else
      unsetenv(n);
  }
  ~EnvScope() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;
};

// The default model the integration tests use: $TROUPE_MODEL_PATH, else
// $TROUPE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf with TROUPE_HOME defaulting to
// ~/.cache/troupe. Tests that need it FAIL (not skip) when it is missing: see
// model_missing_message().
inline std::string default_model_path() {
  if (const char* p = std::getenv("TROUPE_MODEL_PATH"); p && *p) return p;
  std::string home;
  if (const char* h = std::getenv("TROUPE_HOME"); h && *h) {
    home = h;
  } else {
    const char* user_home = std::getenv("HOME");
    home = std::string(user_home && *user_home ? user_home : "/root") + "/.cache/troupe";
  }
  return home + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

inline std::string model_missing_message(const std::string& path) {
  return "model file not found: " + path + " -- run scripts/fetch-model (or set TROUPE_MODEL_PATH / TROUPE_HOME)";
}

// Directory of the source tree, for golden data (set by CMake; falls back to the cwd).
inline std::string source_dir() {
#ifdef TROUPE_SOURCE_DIR
  return TROUPE_SOURCE_DIR;
#else
  return ".";
#endif
}

}  // namespace troupe::test
