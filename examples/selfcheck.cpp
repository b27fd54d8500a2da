// coda_selfcheck: a short end-to-end check a new user runs first (tools/quickstart).
//  1. The float64 reference: the two rewrites CODA rests on (deferred row scale, the zdz identity) and the blocked
//     log-sum-exp merge hold on random inputs.
//  2. On an sm_90 GPU: every kernel in this build against that reference under the acceptance rule
//     (MATH.md: max|coda - ref| <= 2 max|unfused - ref| + 1e-6), and which ops are not built yet.
// Exit status 0 when every check that could run passed.
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "reference/reference.hpp"

namespace ref = coda::ref;

namespace {

int g_failures = 0;

void report(char const* what, bool pass, std::string const& detail) {
  std::printf("  %-58s %s  %s\n", what, pass ? "PASS" : "FAIL", detail.c_str());
  if (!pass) ++g_failures;
}

std::string fmt(char const* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void reference_checks() {
  std::printf("float64 reference (CPU):\n");
  ref::Rng rng(2026);
  int64_t const M = 37, K = 48, N = 40;
  ref::Matrix const x = ref::random_residual(M, K, rng), w = ref::random_weight(N, K, rng);
  ref::Vector const gamma = ref::random_gamma(K, rng);
  double const eps = 1e-5;

  // Deferred row scale: diag(r) (x*gamma) w^T == RMSNorm(x) w^T.
  ref::RmsnormPrepare const prep = ref::rmsnorm_prepare(x, gamma, eps);
  ref::Matrix const fused = ref::linear_rowscale(prep.h, w, prep.rstd);
  ref::Matrix const direct = ref::linear(ref::rmsnorm(x, gamma, eps), w);
  double const e1 = ref::max_abs_diff(fused, direct);
  report("deferred row scale == RMSNorm then linear", e1 < 1e-12, fmt("max diff %.2e", e1));

  // ZdZ: the linear_residual_rmsnorm_bwd epilogue with zdz = (1/N) <dz, z> equals the textbook RMSNorm backward.
  ref::Matrix const a = ref::rmsnorm(x, gamma, eps);
  ref::Matrix const dz = ref::random_activation(M, N, rng);
  ref::Matrix const z = ref::linear(a, w);
  ref::Vector const zdz = ref::row_dot(z, dz, 1.0 / static_cast<double>(K));
  ref::ResidualRmsnormBwd const bwd =
      ref::linear_residual_rmsnorm_bwd(dz, w, x, gamma, prep.rstd, zdz, nullptr, 1.0);
  ref::RmsnormGrad const textbook = ref::rmsnorm_bwd(x, gamma, eps, ref::dgrad(dz, w));
  double const e2 = ref::max_abs_diff(bwd.dx, textbook.dx);
  report("zdz rewrite == textbook RMSNorm backward (dx)", e2 < 1e-10, fmt("max diff %.2e", e2));

  // Blocked (per-tile, per-lane) log-sum-exp merge == direct log-sum-exp, with a partial last tile.
  ref::Matrix const logits = ref::random_normal(M, 300, 0.0, 4.0, rng);
  ref::BlockedLse const blocked = ref::blocked_lse(logits, 128, 0.0);
  double const e3 = ref::max_abs_diff(blocked.lse, ref::logsumexp_rows(logits));
  report("blocked log-sum-exp merge == direct (V=300, tile 128)", e3 < 1e-12, fmt("max diff %.2e", e3));
}

// Device memory holding `bytes`, freed at scope exit.
struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) {
    if (cudaMalloc(&p, bytes > 0 ? bytes : 256) != cudaSuccess) p = nullptr;
  }
  ~Device() { cudaFree(p); }
  Device(Device const&) = delete;
  Device& operator=(Device const&) = delete;
};

coda_tensor tensor(void* p, coda_dtype dtype, int rank, int64_t rows, int64_t cols) {
  coda_tensor t{p, dtype, rank, {rows, cols}, {rank == 2 ? cols : 1, 1}, 0};
  cudaGetDevice(&t.device);
  return t;
}

// The first-layer norm and cross-entropy kernels against the reference (acceptance rule).
void small_kernel_checks() {
  ref::Rng rng(11);
  {
    int64_t const M = 333, N = 264;
    ref::Matrix const x = ref::round_to(ref::random_residual(M, N, rng), CODA_BF16);
    ref::Vector const gamma = ref::round_to(ref::random_gamma(N, rng), CODA_BF16);
    std::vector<uint16_t> const hx = ref::to_bits(x, CODA_BF16), hg = ref::to_bits(gamma, CODA_BF16);
    Device dx(hx.size() * 2), dg(hg.size() * 2), dh(hx.size() * 2), dr(static_cast<size_t>(M) * 4);
    cudaMemcpy(dx.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dg.p, hg.data(), hg.size() * 2, cudaMemcpyHostToDevice);
    cudaMemset(dh.p, 0xFF, hx.size() * 2);
    cudaMemset(dr.p, 0xFF, static_cast<size_t>(M) * 4);
    coda_tensor tx = tensor(dx.p, CODA_BF16, 2, M, N), tg = tensor(dg.p, CODA_BF16, 1, N, 1);
    coda_tensor th = tensor(dh.p, CODA_BF16, 2, M, N), tr = tensor(dr.p, CODA_FP32, 1, M, 1);
    if (coda_rmsnorm_prepare(&tx, &tg, 1e-5f, &th, &tr, nullptr) != CODA_SUCCESS) {
      report("rmsnorm_prepare bf16 333x264", false, coda_last_error());
    } else {
      std::vector<uint16_t> hh(hx.size());
      std::vector<float> hr(static_cast<size_t>(M));
      cudaMemcpy(hh.data(), dh.p, hh.size() * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(hr.data(), dr.p, hr.size() * 4, cudaMemcpyDeviceToHost);
      ref::RmsnormPrepare const want = ref::rmsnorm_prepare(x, gamma, 1e-5);
      ref::RmsnormPrepare const unfused = ref::rmsnorm_prepare_unfused(x, gamma, 1e-5, CODA_BF16);
      ref::Acceptance const ah = ref::acceptance(ref::matrix_from_bits(hh.data(), M, N, CODA_BF16), unfused.h, want.h);
      ref::Acceptance const ar = ref::acceptance(ref::vector_from_float(hr.data(), M), unfused.rstd, want.rstd);
      report("rmsnorm_prepare bf16 333x264: h", ah.pass, ah.message());
      report("rmsnorm_prepare bf16 333x264: rstd", ar.pass, ar.message());
    }
  }
  {
    int64_t const M = 64, V = 1000, hidden = 256;
    ref::Matrix const logits = ref::round_to(ref::random_normal(M, V, 0.0, 3.0, rng), CODA_BF16);
    ref::Targets const targets = ref::random_targets(M, V, rng, 0.25);
    std::vector<uint16_t> const hl = ref::to_bits(logits, CODA_BF16);
    Device dl(hl.size() * 2), dt(static_cast<size_t>(M) * 8), dloss(4), dd(hl.size() * 2), dz(static_cast<size_t>(M) * 4);
    size_t const wsb = coda_cross_entropy_workspace_size(M, V);
    Device ws(wsb);
    cudaMemcpy(dl.p, hl.data(), hl.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dt.p, targets.data(), static_cast<size_t>(M) * 8, cudaMemcpyHostToDevice);
    cudaMemset(dd.p, 0xFF, hl.size() * 2);
    coda_tensor tl = tensor(dl.p, CODA_BF16, 2, M, V), tt = tensor(dt.p, CODA_INT64, 1, M, 1);
    coda_tensor tloss = tensor(dloss.p, CODA_FP32, 0, 1, 1), td = tensor(dd.p, CODA_BF16, 2, M, V);
    coda_tensor tz = tensor(dz.p, CODA_FP32, 1, M, 1);
    coda_ce_options const o = coda_ce_options_default();
    if (coda_cross_entropy(&tl, &tt, &o, nullptr, hidden, &tloss, &td, &tz, ws.p, wsb, nullptr) != CODA_SUCCESS) {
      report("cross_entropy bf16 64x1000 (mean, 25% ignored)", false, coda_last_error());
    } else {
      float loss = 0.0f;
      std::vector<uint16_t> hd(hl.size());
      cudaMemcpy(&loss, dloss.p, 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(hd.data(), dd.p, hd.size() * 2, cudaMemcpyDeviceToHost);
      ref::CrossEntropy const want = ref::cross_entropy(logits, targets, o, {}, hidden);
      ref::CrossEntropy const unfused = ref::cross_entropy_unfused(logits, targets, o, {}, hidden, CODA_BF16);
      ref::Acceptance const al = ref::acceptance(static_cast<double>(loss), unfused.loss[0], want.loss[0]);
      ref::Acceptance const ad =
          ref::acceptance(ref::matrix_from_bits(hd.data(), M, V, CODA_BF16), unfused.dlogits, want.dlogits);
      report("cross_entropy bf16 64x1000 (mean, 25% ignored): loss", al.pass, al.message());
      report("cross_entropy bf16 64x1000 (mean, 25% ignored): dlogits", ad.pass, ad.message());
    }
  }
}

/// Whether gpu_checks() ran the kernels (an sm_90 device was there).
bool g_gpu_ran = false;

void gpu_checks() {
  std::printf("kernels (GPU):\n");
  int supported = 0, major = 0, minor = 0;
  if (coda_device_supported(-1, &supported, &major, &minor) != CODA_SUCCESS) {
    std::printf("  no CUDA device: %s\n  kernels not run (they need an sm_90 GPU: H100/H200)\n", coda_last_error());
    return;
  }
  if (!supported) {
    std::printf("  device is sm_%d%d: kernels not run (they need sm_90: H100/H200)\n", major, minor);
    return;
  }
  std::printf("  sm_%d%d device: supported\n", major, minor);
  g_gpu_ran = true;

  // coda_gemm on an awkward shape against the reference and the unfused bf16 pipeline.
  ref::Rng rng(7);
  int64_t const M = 1000, N = 264, K = 520;
  ref::Matrix const a = ref::random_activation(M, K, rng), b = ref::random_weight(N, K, rng);
  std::vector<uint16_t> const ha = ref::to_bits(a, CODA_BF16), hb = ref::to_bits(b, CODA_BF16);
  void *da = nullptr, *db = nullptr, *dd = nullptr, *ws = nullptr;
  size_t const wsb = coda_gemm_workspace_size(M, N, K);
  bool ok = cudaMalloc(&da, ha.size() * 2) == cudaSuccess && cudaMalloc(&db, hb.size() * 2) == cudaSuccess &&
            cudaMalloc(&dd, static_cast<size_t>(M * N) * 2) == cudaSuccess &&
            cudaMalloc(&ws, wsb > 0 ? wsb : 256) == cudaSuccess;
  ok = ok && cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemset(dd, 0xFF, static_cast<size_t>(M * N) * 2) == cudaSuccess;
  if (!ok) {
    report("gemm: device buffers", false, cudaGetErrorString(cudaGetLastError()));
  } else {
    coda_tensor ta{da, CODA_BF16, 2, {M, K}, {K, 1}, 0}, tb{db, CODA_BF16, 2, {N, K}, {K, 1}, 0};
    coda_tensor td{dd, CODA_BF16, 2, {M, N}, {N, 1}, 0};
    cudaGetDevice(&ta.device);
    tb.device = td.device = ta.device;
    coda_status const s = coda_gemm(&ta, &tb, &td, 1.0f, 0, ws, wsb, nullptr);
    if (s != CODA_SUCCESS) {
      report("gemm bf16 1000x264x520", false, coda_last_error());
    } else {
      std::vector<uint16_t> hd(static_cast<size_t>(M * N));
      cudaMemcpy(hd.data(), dd, hd.size() * 2, cudaMemcpyDeviceToHost);
      ref::Matrix const got = ref::matrix_from_bits(hd.data(), M, N, CODA_BF16);
      ref::Matrix const ar = ref::round_to(a, CODA_BF16), br = ref::round_to(b, CODA_BF16);
      ref::Acceptance const acc = ref::acceptance(got, ref::linear_unfused(a, b, CODA_BF16), ref::linear(ar, br));
      report("gemm bf16 1000x264x520 vs float64 reference", acc.pass, acc.message());
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
  cudaFree(ws);
  small_kernel_checks();
}

}  // namespace

int main() {
  int const v = coda_version();
  std::printf("CODA %d.%d.%d self-check\n", v / 10000, v / 100 % 100, v % 100);
  reference_checks();
  gpu_checks();
  if (g_failures != 0) {
    std::printf("self-check: FAILED\n");
  } else if (g_gpu_ran) {
    std::printf("self-check: all checks passed (CPU reference and GPU kernels)\n");
  } else {
    std::printf("self-check: the CPU checks passed; the GPU kernels were not run (no sm_90 GPU)\n");
  }
  return g_failures == 0 ? 0 : 1;
}
