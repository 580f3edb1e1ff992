// Backend helpers shared by every backend, and the --device switch.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "kernels/backend.h"

namespace troupe {

void Backend::copy_in(float* dst, const float* src, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void Backend::copy_out(float* dst, const float* src, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }

float* Backend::upload(const std::vector<float>& v) {
  float* p = alloc(v.size());
  if (!v.empty()) copy_in(p, v.data(), v.size());
  return p;
}

Status Backend::sample(const float*, int64_t, int64_t, const DeviceSampleParams*, int32_t*, float*) {
  return make_error("backend " + name() + " does not sample; sample on the host");
}

void Backend::add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                           const Weight* next) {
  add(x, y, n * dim);
  rms_norm(x, w, eps, n, dim, out, next);
}

void Backend::rope_kv_write(KvCache& cache, int32_t layer, float* qkv, int64_t ld, int64_t n, int32_t num_heads,
                            int32_t num_kv_heads, int64_t head_dim, const float* cos_sin, RopeKind kind) {
  float* k = qkv + int64_t{num_heads} * head_dim;
  rope(qkv, ld, n, num_heads, head_dim, cos_sin, kind);
  rope(k, ld, n, num_kv_heads, head_dim, cos_sin, kind);
  kv_write(cache, layer, k, k + int64_t{num_kv_heads} * head_dim, ld);
}

void Backend::matmul_silu(const Weight& gate_up, const float* x, int64_t n, int64_t ffn, float* gu, float* out,
                          const Weight* next) {
  matmul(gate_up, x, n, gu, 2 * ffn);
  silu_mul(gu, n, ffn, out, next);
}

void Backend::matmul_rope_kv_write(const Weight& wqkv, const float* x, KvCache& cache, int32_t layer, float* qkv,
                                   int64_t ld, int64_t n, int32_t num_heads, int32_t num_kv_heads, int64_t head_dim,
                                   const float* cos_sin, RopeKind kind) {
  matmul(wqkv, x, n, qkv, ld);
  rope_kv_write(cache, layer, qkv, ld, n, num_heads, num_kv_heads, head_dim, cos_sin, kind);
}

void moe_combine_host(const float* y, int64_t dim, const int32_t* src, const float* weights, int64_t n, int32_t k,
                      float* out) {
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * dim;
    const float w0 = weights[t * k];
    const float* y0 = y + int64_t{src[t * k]} * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = w0 * y0[i];
    for (int32_t j = 1; j < k; ++j) {
      const float w = weights[t * k + j];
      const float* yj = y + int64_t{src[t * k + j]} * dim;
      for (int64_t i = 0; i < dim; ++i) o[i] += w * yj[i];
    }
  }
}

void rms_norm_strided_host(float* x, int64_t ld, int64_t n, int64_t groups, int64_t dim, const float* w, float eps) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      float* v = x + t * ld + g * dim;
      double ss = 0;
      for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(v[j]) * v[j];
      // As GGML (and cpu::rms_norm_rows): the sum in double, the rest in float.
      const float mean = static_cast<float>(ss / static_cast<double>(dim));
      const float scale = 1.0f / std::sqrt(mean + eps);
      for (int64_t j = 0; j < dim; ++j) v[j] = v[j] * scale * w[j];
    }
}

void Backend::rms_norm_strided(float* x, int64_t ld, int64_t n, int64_t groups, int64_t dim, const float* w,
                               float eps) {
  if (n <= 0 || groups <= 0 || dim <= 0) return;
  if (is_host_memory()) return rms_norm_strided_host(x, ld, n, groups, dim, w, eps);
  std::vector<float> hx(static_cast<size_t>((n - 1) * ld + groups * dim)), hw(static_cast<size_t>(dim));
  copy_out(hx.data(), x, hx.size());
  copy_out(hw.data(), w, hw.size());
  rms_norm_strided_host(hx.data(), ld, n, groups, dim, hw.data(), eps);
  copy_in(x, hx.data(), hx.size());
}

void Backend::moe_combine(const float* y, int64_t dim, const int32_t* src, const float* weights, int64_t n, int32_t k,
                          float* out) {
  if (n <= 0 || k <= 0) return;
  if (is_host_memory()) return moe_combine_host(y, dim, src, weights, n, k, out);
  int32_t rows = 0;
  for (int64_t i = 0; i < n * k; ++i) rows = std::max(rows, src[i] + 1);
  std::vector<float> hy(static_cast<size_t>(rows) * dim), ho(static_cast<size_t>(n) * dim);
  copy_out(hy.data(), y, hy.size());
  moe_combine_host(hy.data(), dim, src, weights, n, k, ho.data());
  copy_in(out, ho.data(), ho.size());
}

namespace {
// The value of environment variable `name` if it is set and not empty.
const char* env_value(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
Error bad_env(const char* name, const char* value, const std::string& takes) {
  return make_error(std::string(name) + "='" + value + "' is not a value it takes: " + takes + " (docs/flags.md)");
}
// One of `choices` (its index), or -1 when the variable is unset or empty.
Result<int> env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* v = env_value(name);
  if (!v) return -1;
  std::string takes;
  int i = 0;
  for (const char* c : choices) {
    if (!std::strcmp(v, c)) return i;
    takes += (i ? ", " : "") + std::string(c);
    ++i;
  }
  return bad_env(name, v, "one of " + takes);
}
}  // namespace

Result<CudaEnvOptions> cuda_env_options() {
  CudaEnvOptions o;
  auto gemv = env_choice("TROUPE_CUDA_GEMV", {"simple", "auto"});
  if (!gemv.ok()) return gemv.error();
  o.simple_gemv = *gemv == 0;
  auto attn = env_choice("TROUPE_CUDA_ATTN", {"direct", "staged", "tc", "wmma"});
  if (!attn.ok()) return attn.error();
  o.direct_k = *attn == 0;
  o.tc_attention = *attn == 2 || *attn == 3;
  o.wmma_attention = *attn == 3;
  auto fuse = env_choice("TROUPE_CUDA_FUSE", {"0", "1"});
  if (!fuse.ok()) return fuse.error();
  o.fuse = *fuse != 0;
  if (const char* v = env_value("TROUPE_CUDA_Q8_MMA")) {
    const size_t len = std::strlen(v);
    if (len > 9 || std::strspn(v, "0123456789") != len)
      return bad_env("TROUPE_CUDA_Q8_MMA", v, "a token count, 0 to 999999999 (0: never)");
    o.q8_mma_min = std::atoll(v);
  }
  return o;
}

Status check_cpu_isa_env() {
  auto isa = env_choice("TROUPE_CPU_ISA", {"scalar", "avx2", "avx512"});
  if (!isa.ok()) return isa.error();
  return {};
}

namespace {
std::atomic<CudaBackendFactory> g_cuda_factory{nullptr};
Result<std::unique_ptr<Backend>> cuda_backend(const CudaBackendOptions& opts) {
  const CudaBackendFactory f = g_cuda_factory.load();
  return f ? f(opts) : make_cuda_backend(opts);
}
}  // namespace

void set_cuda_backend_factory_for_tests(CudaBackendFactory factory) { g_cuda_factory.store(factory); }

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int cpu_threads,
                                              const CudaBackendOptions& cuda) {
  if (device == "cpu") {
    if (Status st = check_cpu_isa_env(); !st.ok()) return st.error();
    return make_cpu_backend(CpuBackendOptions{cpu_threads});
  }
  CudaBackendOptions opts = cuda;
  opts.device = 0;
  if (device == "cuda") return cuda_backend(opts);
  if (device.rfind("cuda:", 0) == 0) {
    const std::string num = device.substr(5);
    if (num.find(',') != std::string::npos)
      return make_error(
          "--device '" + device +
          "' names several GPUs: only troupe serve takes a list, spreading its --pipeline-stages over them");
    if (num.empty() || num.size() > 3 || num.find_first_not_of("0123456789") != std::string::npos)
      return make_error("--device '" + device + "': expected cuda:N with N a device number");
    opts.device = std::stoi(num);
    return cuda_backend(opts);
  }
  return make_error("--device '" + device + "' is not one of cpu, cuda, cuda:N");
}

Result<std::vector<std::string>> stage_devices(const std::string& device, int32_t num_stages) {
  if (num_stages < 1) return make_error("at least one pipeline stage is needed");
  if (device.rfind("cuda:", 0) != 0 || device.find(',') == std::string::npos)
    return std::vector<std::string>(static_cast<size_t>(num_stages), device);
  std::vector<std::string> gpus;
  const std::string list = device.substr(5);
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string num = list.substr(at, end - at);
    if (num.empty() || num.size() > 3 || num.find_first_not_of("0123456789") != std::string::npos)
      return make_error("--device '" + device + "': expected cuda:N,M,... with device numbers (got '" + num + "')");
    gpus.push_back("cuda:" + num);
    at = end + 1;
  }
  if (gpus.size() > static_cast<size_t>(num_stages))
    return make_error("--device '" + device + "' names " + std::to_string(gpus.size()) + " GPUs for " +
                      std::to_string(num_stages) + " pipeline stage(s): give --pipeline-stages at least " +
                      std::to_string(gpus.size()));
  std::vector<std::string> out;
  for (int32_t s = 0; s < num_stages; ++s) out.push_back(gpus[static_cast<size_t>(s) * gpus.size() / num_stages]);
  return out;
}

}  // namespace troupe
