// C ABI of the CODA block (include/coda/block.h): validation of the whole block once, then the fused ops in order
// through their internal entries (coda::ops, coda::kernels: no second validation per step; an error there names the
// step) and the weight-gradient GEMMs through coda_gemm. Temporaries come from the caller's workspace, carved in
// 256-byte aligned slots.
#include <coda/block.h>
#include <coda/coda.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "api/checks.hpp"
#include "api/compose.hpp"
#include "api/guard.hpp"
#include "api/validate.hpp"
#include "kernels/kernels.hpp"
#include "ops/linear_residual_rmsnorm/kernels.hpp"
#include "ops/linear_residual_rmsnorm_bwd/kernels.hpp"
#include "ops/linear_rowscale_qk_norm_rope/kernels.hpp"
#include "ops/linear_rowscale_rope/kernels.hpp"
#include "ops/linear_rowscale_swiglu/kernels.hpp"
#include "ops/linear_swiglu_bwd_zdz/kernels.hpp"
#include "ops/op_config.hpp"

#include <cuda_runtime_api.h>

using coda::api::Arg;
using coda::api::guarded;
using coda::api::Carver;
using coda::api::row_stride;
using coda::api::step;
using coda::api::transposed;
using coda::api::view2d;
using coda::detail::fail;
namespace api = coda::api;

namespace {

struct Dims {
  int64_t M, d, F, qo, W;  // tokens, hidden, intermediate, hq hd (attention output), (hq + 2 hkv) hd (q/k/v)
};

/// A block struct's size in version 1 (block.h "Versioning"): up to its first version-2 field.
template <class T>
constexpr size_t v1_size();
template <>
constexpr size_t v1_size<coda_block_config>() { return offsetof(coda_block_config, qk_eps); }
template <>
constexpr size_t v1_size<coda_block_weights>() { return offsetof(coda_block_weights, q_gamma); }
template <>
constexpr size_t v1_size<coda_block_grads>() { return offsetof(coda_block_grads, q_gamma); }
template <>
constexpr size_t v1_size<coda_block_saved>() { return offsetof(coda_block_saved, z); }

/// A struct_size this library reads: this header's (version 2) or version 1's.
template <class T>
bool known_size(T const* t) {
  return t != nullptr && (t->struct_size == sizeof(T) || t->struct_size == v1_size<T>());
}

/// The caller's struct as this version: the fields an older caller's struct lacks take their defaults (zero: no
/// QK-norm, tensors unset). Every check and step below reads the copy.
template <class T>
T current(T const& t) {
  T out{};
  std::memcpy(static_cast<void*>(&out), &t, t.struct_size);
  out.struct_size = sizeof(T);
  return out;
}

template <class T>
T checked_struct(T const* t, char const* name, char const* type, char const* init) {
  if (t == nullptr) fail(CODA_ERROR_INVALID_ARGUMENT, name, ": must not be NULL");
  if (!known_size(t)) {
    fail(CODA_ERROR_INVALID_ARGUMENT, name, ".struct_size: must be sizeof(", type, ") = ", sizeof(T), " (", init,
         ") or version 1's ", v1_size<T>(), ", got ", t->struct_size,
         t->struct_size == 0 ? " (not set)" : " (a header this library does not know)");
  }
  return current(*t);
}

/// A version-2 tensor field the configuration does not use must stay unset (zero), so that a QK-norm weight given
/// with config.qk_eps = 0 is an error, not silently ignored.
void require_unset(coda_tensor const& t, char const* name) {
  if (t.data != nullptr || t.rank != 0) {
    fail(CODA_ERROR_INVALID_ARGUMENT, name, ": set, but config.qk_eps is 0 (no QK-norm): leave it unset (zero) or set "
         "config.qk_eps");
  }
}

/// With QK-norm its tensor fields are required: a clearer error than the tensor rules' for a zero descriptor.
void require_set(coda_tensor const& t, char const* name) {
  if (t.data == nullptr && t.rank == 0) {
    fail(CODA_ERROR_INVALID_ARGUMENT, name, ": required with config.qk_eps > 0 (QK-norm), but unset");
  }
}

/// An optional tensor field as an argument of the shared checks: NULL (skipped by them) when unused.
Arg optional(coda_tensor const& t, char const* name, bool used) { return {used ? &t : nullptr, name}; }

coda_block_config check_config(coda_block_config const* config) {
  coda_block_config const cfg = checked_struct(config, "config", "coda_block_config", "CODA_BLOCK_CONFIG_INIT");
  coda_block_config const* const c = &cfg;
  if (c->hidden_size <= 0 || c->hidden_size % 8 != 0) {
    fail(CODA_ERROR_SHAPE, "config.hidden_size: must be a positive multiple of 8, got ", c->hidden_size);
  }
  if (c->intermediate_size <= 0 || c->intermediate_size % 8 != 0) {
    fail(CODA_ERROR_SHAPE, "config.intermediate_size: must be a positive multiple of 8, got ", c->intermediate_size);
  }
  if (c->head_dim != 64 && c->head_dim != 128) {
    fail(CODA_ERROR_SHAPE, "config.head_dim: must be 64 or 128, got ", c->head_dim);
  }
  if (c->n_q_heads <= 0 || c->n_kv_heads <= 0 || c->n_q_heads % c->n_kv_heads != 0) {
    fail(CODA_ERROR_SHAPE, "config.n_q_heads, config.n_kv_heads: must be > 0 with n_kv_heads dividing n_q_heads, got ",
         c->n_q_heads, " and ", c->n_kv_heads);
  }
  api::check_eps(c->eps);
  if (!(c->qk_eps >= 0.0f) || !std::isfinite(c->qk_eps)) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "config.qk_eps: must be finite and >= 0 (0: no QK-norm), got ", c->qk_eps);
  }
  if (c->reserved != 0) fail(CODA_ERROR_INVALID_ARGUMENT, "config.reserved: must be 0, got ", c->reserved);
  return cfg;
}

bool has_qk_norm(coda_block_config const& c) { return c.qk_eps > 0.0f; }

Dims dims_of(coda_block_config const& c, int64_t M) {
  int64_t const hd = c.head_dim;
  return {M, c.hidden_size, c.intermediate_size, c.n_q_heads * hd, (c.n_q_heads + 2 * int64_t{c.n_kv_heads}) * hd};
}

/// A weight [rows, cols] in the block's dtype (that of `like`), row-major, TMA-aligned.
void check_weight(Arg w, Arg like, int64_t rows, int64_t cols, char const* rows_what, char const* cols_what) {
  api::require_tensor(w);
  api::require_rank(w, 2);
  api::require_same_dtype(w, like);
  api::require_size(w, 0, rows, rows_what, "config");
  api::require_size(w, 1, cols, cols_what, "config");
  api::require_row_major(w);
  api::require_tma_aligned(w, true);
}

coda_block_weights check_weights(coda_block_weights const* weights, Arg like, Dims const& s,
                                 coda_block_config const& c) {
  coda_block_weights const cw =
      checked_struct(weights, "weights", "coda_block_weights", "CODA_BLOCK_WEIGHTS_INIT");
  coda_block_weights const* const w = &cw;
  check_weight({&w->w_o, "weights.w_o"}, like, s.d, s.qo, "hidden_size", "n_q_heads * head_dim");
  api::check_vector({&w->gamma1, "weights.gamma1"}, s.d, {like.dtype()}, "hidden_size", "config");
  check_weight({&w->w_gu, "weights.w_gu"}, like, 2 * s.F, s.d, "2 * intermediate_size", "hidden_size");
  check_weight({&w->w_down, "weights.w_down"}, like, s.d, s.F, "hidden_size", "intermediate_size");
  api::check_vector({&w->gamma2, "weights.gamma2"}, s.d, {like.dtype()}, "hidden_size", "config");
  check_weight({&w->w_qkv, "weights.w_qkv"}, like, s.W, s.d, "(n_q_heads + 2 n_kv_heads) * head_dim", "hidden_size");
  if (has_qk_norm(c)) {
    require_set(w->q_gamma, "weights.q_gamma");
    require_set(w->k_gamma, "weights.k_gamma");
    api::check_qk_norm_args({&w->q_gamma, "weights.q_gamma"}, {&w->k_gamma, "weights.k_gamma"}, c.head_dim, c.qk_eps,
                            "config.qk_eps");
  } else {
    require_unset(w->q_gamma, "weights.q_gamma");
    require_unset(w->k_gamma, "weights.k_gamma");
  }
  return cw;
}

/// A weight gradient: the weight's shape, fp32 or the weight's dtype, row-major, TMA-aligned.
void check_grad(Arg g, Arg w) {
  api::require_tensor(g);
  api::require_rank(g, 2);
  api::require_dtype(g, {w.dtype(), CODA_FP32});
  api::require_size(g, 0, w.size(0), "rows", w.name);
  api::require_size(g, 1, w.size(1), "cols", w.name);
  api::require_row_major(g);
  api::require_tma_aligned(g, true);
}

/// The saved tensors: shapes and dtypes (the block's dtype is y0's).
coda_block_saved check_saved(coda_block_saved const* saved_in, Arg like, Dims const& s, bool qk_norm) {
  coda_block_saved const copy = checked_struct(saved_in, "saved", "coda_block_saved", "CODA_BLOCK_SAVED_INIT");
  coda_block_saved const* const saved = &copy;
  api::check_activation({&saved->x1, "saved.x1"}, like, s.M, s.d, "M", "hidden_size");
  api::check_vector({&saved->rstd1, "saved.rstd1"}, s.M, {CODA_FP32}, "M", "y0.sizes[0]");
  api::check_activation({&saved->z1, "saved.z1"}, like, s.M, 2 * s.F, "M", "2 * intermediate_size");
  api::check_activation({&saved->x2, "saved.x2"}, like, s.M, s.d, "M", "hidden_size");
  api::check_vector({&saved->rstd2, "saved.rstd2"}, s.M, {CODA_FP32}, "M", "y0.sizes[0]");
  api::check_activation({&saved->qkv, "saved.qkv"}, like, s.M, s.W, "M", "(n_q_heads + 2 n_kv_heads) * head_dim");
  if (qk_norm) {
    require_set(saved->z, "saved.z");
    api::check_activation({&saved->z, "saved.z"}, like, s.M, s.W, "M", "(n_q_heads + 2 n_kv_heads) * head_dim");
  } else {
    require_unset(saved->z, "saved.z");
  }
  return copy;
}

/// The used part of the caller's workspace (the block's temporaries and the ops' scratch) must not overlap any tensor
/// of the call: checked as a [ceil(bytes / 4)] fp32 view.
void require_workspace_disjoint(void* workspace, size_t bytes, int device, std::initializer_list<Arg> tensors) {
  if (bytes == 0) return;
  coda_tensor const view = api::view1d(workspace, CODA_FP32, static_cast<int64_t>((bytes + 3) / 4), device);
  api::check_disjoint({{&view, "workspace"}}, tensors);
}

/// The saved and weight tensors as named arguments of the shared checks (the QK-norm ones NULL without it).
struct SavedArgs {
  Arg x1, rstd1, z1, x2, rstd2, qkv, z;
};
SavedArgs saved_args(coda_block_saved const& sv, bool qk_norm) {
  return {{&sv.x1, "saved.x1"}, {&sv.rstd1, "saved.rstd1"}, {&sv.z1, "saved.z1"}, {&sv.x2, "saved.x2"},
          {&sv.rstd2, "saved.rstd2"}, {&sv.qkv, "saved.qkv"}, optional(sv.z, "saved.z", qk_norm)};
}

struct WeightArgs {
  Arg w_o, gamma1, w_gu, w_down, gamma2, w_qkv, q_gamma, k_gamma;
};
WeightArgs weight_args(coda_block_weights const& w, bool qk_norm) {
  return {{&w.w_o, "weights.w_o"},       {&w.gamma1, "weights.gamma1"}, {&w.w_gu, "weights.w_gu"},
          {&w.w_down, "weights.w_down"}, {&w.gamma2, "weights.gamma2"}, {&w.w_qkv, "weights.w_qkv"},
          optional(w.q_gamma, "weights.q_gamma", qk_norm), optional(w.k_gamma, "weights.k_gamma", qk_norm)};
}

// ---- forward -----------------------------------------------------------------------------------------------------

struct ForwardPlan {
  void* h;        // [M, d] h1, then h2
  void* y1;       // [M, F]
  void* op_ws;    // the largest op workspace
  size_t op_ws_bytes;
  size_t total;
};

ForwardPlan plan_forward(Dims const& s, void* workspace) {
  Carver c(workspace);
  ForwardPlan p{};
  p.h = c.take(static_cast<size_t>(s.M * s.d) * 2);
  p.y1 = c.take(static_cast<size_t>(s.M * s.F) * 2);
  p.op_ws_bytes = std::max({coda_linear_residual_rmsnorm_workspace_size(s.M, s.d),
                            coda_linear_rowscale_swiglu_workspace_size(s.M, 2 * s.F),
                            coda_linear_rowscale_rope_workspace_size(s.M, s.W)});
  p.op_ws = c.take(p.op_ws_bytes);
  p.total = c.used();
  return p;
}

// ---- backward ----------------------------------------------------------------------------------------------------

struct BackwardPlan {
  void* a;     // [M, d] a2, then a1
  void* y1;    // [M, F]
  float* zdz1;
  float* zdz2;
  void* op_ws;
  size_t op_ws_bytes;
  size_t total;
};

BackwardPlan plan_backward(Dims const& s, coda_block_config const& cfg, void* workspace) {
  Carver c(workspace);
  BackwardPlan p{};
  p.a = c.take(static_cast<size_t>(s.M * s.d) * 2);
  p.y1 = c.take(static_cast<size_t>(s.M * s.F) * 2);
  p.zdz1 = static_cast<float*>(c.take(static_cast<size_t>(s.M) * 4));
  p.zdz2 = static_cast<float*>(c.take(static_cast<size_t>(s.M) * 4));
  p.op_ws_bytes = std::max({coda_linear_residual_rmsnorm_bwd_workspace_size(s.M, s.d),
                            coda_linear_swiglu_bwd_zdz_workspace_size(s.M, s.F),
                            coda_gemm_workspace_size(s.W, s.d, s.M), coda_gemm_workspace_size(s.d, s.F, s.M),
                            coda_gemm_workspace_size(2 * s.F, s.d, s.M), coda_gemm_workspace_size(s.M, s.qo, s.d),
                            coda_gemm_workspace_size(s.d, s.qo, s.M),
                            has_qk_norm(cfg) && cfg.head_dim > 0
                                ? coda::kernels::qk_norm_rope_bwd_workspace_bytes(s.M, cfg.head_dim)
                                : 0});
  p.op_ws = c.take(p.op_ws_bytes);
  p.total = c.used();
  return p;
}

}  // namespace

extern "C" {

CODA_API size_t coda_block_forward_workspace_size(const coda_block_config* config, int64_t M) {
  if (!known_size(config) || M < 0 || config->hidden_size <= 0 || config->intermediate_size <= 0) return 0;
  return plan_forward(dims_of(current(*config), M), nullptr).total;
}

CODA_API size_t coda_block_backward_workspace_size(const coda_block_config* config, int64_t M) {
  if (!known_size(config) || M < 0 || config->hidden_size <= 0 || config->intermediate_size <= 0) return 0;
  coda_block_config const c = current(*config);
  return plan_backward(dims_of(c, M), c, nullptr).total;
}

CODA_API coda_status coda_block_forward(const coda_block_config* config, const coda_block_weights* weights,
                                        const coda_tensor* y0, const coda_tensor* x0, const coda_tensor* positions,
                                        const coda_tensor* inv_freq, coda_block_saved* saved, void* workspace,
                                        size_t workspace_bytes, void* stream) {
  return guarded("coda_block_forward", [&] {
    coda_block_config const cfg = check_config(config);
    bool const qk_norm = has_qk_norm(cfg);
    Arg const Y0{y0, "y0"}, X0{x0, "x0"}, P{positions, "positions"}, IF{inv_freq, "inv_freq"};
    api::require_tensor(Y0);
    api::require_rank(Y0, 2);
    api::require_dtype(Y0, {CODA_BF16, CODA_FP16});
    Dims const s = dims_of(cfg, Y0.size(0));
    api::check_activation(Y0, Y0, s.M, s.qo, "M", "n_q_heads * head_dim");
    api::check_activation(X0, Y0, s.M, s.d, "M = y0.sizes[0]", "hidden_size");
    coda_block_weights const w = check_weights(weights, Y0, s, cfg);
    api::check_rope_args(P, IF, cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim, s.M);
    coda_block_saved const sv = check_saved(saved, Y0, s, qk_norm);
    auto const [X1, R1, Z1, X2, R2, Q, Z] = saved_args(sv, qk_norm);
    api::require_same_or_disjoint(X1, X0);  // x1 may replace x0 in place
    auto const [WO, G1, WGU, WD, G2, WQ, GQ, GK] = weight_args(w, qk_norm);
    api::check_disjoint({X1, R1, Z1, X2, R2, Q, Z}, {Y0, P, IF, WO, G1, WGU, WD, G2, WQ, GQ, GK});
    api::check_disjoint({X2, R1, Z1, R2, Q, Z}, {X0});
    ForwardPlan const plan = plan_forward(s, workspace);
    api::require_workspace("coda_block_forward", workspace, workspace_bytes, plan.total);
    require_workspace_disjoint(workspace, plan.total, y0->device,
                               {Y0, X0, P, IF, X1, R1, Z1, X2, R2, Q, Z, WO, G1, WGU, WD, G2, WQ, GQ, GK});
    int const device =
        api::require_same_device({Y0, X0, P, IF, X1, R1, Z1, X2, R2, Q, Z, WO, G1, WGU, WD, G2, WQ, GQ, GK});
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Y0});
    if (s.M == 0) return;

    bool const fp16 = Y0.dtype() == CODA_FP16;
    auto const st = static_cast<cudaStream_t>(stream);
    float* const rstd1 = static_cast<float*>(sv.rstd1.data);
    float* const rstd2 = static_cast<float*>(sv.rstd2.data);
    // h1 then h2 share one [M, d] temporary; y1 is [M, F]; both dense.
    step("linear_residual_rmsnorm (out-projection + residual + RMSNorm 1)", [&] {
      coda::ops::linear_residual_rmsnorm(s.M, s.d, s.qo, y0->data, row_stride(*y0, s.qo), w.w_o.data,
                                         row_stride(w.w_o, s.qo), x0->data, row_stride(*x0, s.d), w.gamma1.data,
                                         cfg.eps, sv.x1.data, row_stride(sv.x1, s.d), plan.h, s.d, rstd1,
                                         plan.op_ws, plan.op_ws_bytes, fp16, st);
    });
    step("linear_rowscale_swiglu (gate/up + SwiGLU)", [&] {
      coda::ops::linear_rowscale_swiglu(s.M, 2 * s.F, s.d, plan.h, s.d, w.w_gu.data, row_stride(w.w_gu, s.d), rstd1,
                                        sv.z1.data, row_stride(sv.z1, 2 * s.F), plan.y1, s.F, fp16, st);
    });
    step("linear_residual_rmsnorm (down-projection + residual + RMSNorm 2)", [&] {
      coda::ops::linear_residual_rmsnorm(s.M, s.d, s.F, plan.y1, s.F, w.w_down.data, row_stride(w.w_down, s.F),
                                         sv.x1.data, row_stride(sv.x1, s.d), w.gamma2.data, cfg.eps, sv.x2.data,
                                         row_stride(sv.x2, s.d), plan.h, s.d, rstd2, plan.op_ws, plan.op_ws_bytes,
                                         fp16, st);
    });
    if (qk_norm) {
      step("linear_rowscale_qk_norm_rope (q/k/v + QK-norm + RoPE)", [&] {
        coda::ops::linear_rowscale_qk_norm_rope(
            s.M, s.W, s.d, plan.h, s.d, w.w_qkv.data, row_stride(w.w_qkv, s.d),
            coda::ops::qk_norm_rope_args(rstd2, &sv.z, w.q_gamma, w.k_gamma, *positions, *inv_freq, cfg.n_q_heads,
                                         cfg.n_kv_heads, cfg.head_dim, cfg.qk_eps),
            sv.qkv.data, row_stride(sv.qkv, s.W), fp16, st);
      });
      return;
    }
    step("linear_rowscale_rope (q/k/v + RoPE)", [&] {
      coda::ops::linear_rowscale_rope(s.M, s.W, s.d, plan.h, s.d, w.w_qkv.data, row_stride(w.w_qkv, s.d), rstd2,
                                      static_cast<int32_t const*>(positions->data),
                                      static_cast<float const*>(inv_freq->data), cfg.n_q_heads, cfg.n_kv_heads,
                                      cfg.head_dim, sv.qkv.data, row_stride(sv.qkv, s.W), plan.op_ws,
                                      plan.op_ws_bytes, fp16, st);
    });
  });
}

CODA_API coda_status coda_block_backward(const coda_block_config* config, const coda_block_weights* weights,
                                         const coda_tensor* y0, const coda_tensor* positions,
                                         const coda_tensor* inv_freq, const coda_block_saved* saved,
                                         coda_tensor* dqkv, const coda_tensor* dx2, coda_tensor* dy0_out,
                                         coda_tensor* dx0_out, coda_block_grads* grads, void* workspace,
                                         size_t workspace_bytes, void* stream) {
  return guarded("coda_block_backward", [&] {
    coda_block_config const cfg = check_config(config);
    bool const qk_norm = has_qk_norm(cfg);
    Arg const Y0{y0, "y0"}, P{positions, "positions"}, IF{inv_freq, "inv_freq"};
    api::require_tensor(Y0);
    api::require_rank(Y0, 2);
    api::require_dtype(Y0, {CODA_BF16, CODA_FP16});
    Dims const s = dims_of(cfg, Y0.size(0));
    api::check_activation(Y0, Y0, s.M, s.qo, "M", "n_q_heads * head_dim");
    coda_block_weights const w = check_weights(weights, Y0, s, cfg);
    api::check_rope_args(P, IF, cfg.n_q_heads, cfg.n_kv_heads, cfg.head_dim, s.M);
    coda_block_saved const sv = check_saved(saved, Y0, s, qk_norm);
    auto const [X1, R1, Z1, X2, R2, Q, Z] = saved_args(sv, qk_norm);
    Arg const DQ{dqkv, "dqkv"}, DX2{dx2, "dx2"}, DY0{dy0_out, "dy0_out"}, DX0{dx0_out, "dx0_out"};
    api::check_activation(DQ, Y0, s.M, s.W, "M", "(n_q_heads + 2 n_kv_heads) * head_dim");
    if (dx2 != nullptr) api::check_activation(DX2, Y0, s.M, s.d, "M", "hidden_size");
    api::check_activation(DY0, Y0, s.M, s.qo, "M", "n_q_heads * head_dim");
    api::check_activation(DX0, Y0, s.M, s.d, "M", "hidden_size");
    coda_block_grads g = checked_struct(grads, "grads", "coda_block_grads", "CODA_BLOCK_GRADS_INIT");
    auto const [WO, G1, WGU, WD, G2, WQ, GQ, GK] = weight_args(w, qk_norm);
    Arg const GWO{&g.w_o, "grads.w_o"}, GG1{&g.gamma1, "grads.gamma1"}, GWGU{&g.w_gu, "grads.w_gu"};
    Arg const GWD{&g.w_down, "grads.w_down"}, GG2{&g.gamma2, "grads.gamma2"}, GWQ{&g.w_qkv, "grads.w_qkv"};
    Arg const GGQ = optional(g.q_gamma, "grads.q_gamma", qk_norm);
    Arg const GGK = optional(g.k_gamma, "grads.k_gamma", qk_norm);
    check_grad(GWO, WO);
    check_grad(GWGU, WGU);
    check_grad(GWD, WD);
    check_grad(GWQ, WQ);
    api::check_vector(GG1, s.d, {CODA_FP32}, "hidden_size", "config");
    api::check_vector(GG2, s.d, {CODA_FP32}, "hidden_size", "config");
    if (qk_norm) {
      require_set(g.q_gamma, "grads.q_gamma");
      require_set(g.k_gamma, "grads.k_gamma");
      api::check_vector(GGQ, cfg.head_dim, {CODA_FP32}, "head_dim", "config");
      api::check_vector(GGK, cfg.head_dim, {CODA_FP32}, "head_dim", "config");
    } else {
      require_unset(g.q_gamma, "grads.q_gamma");
      require_unset(g.k_gamma, "grads.k_gamma");
    }
    api::require_same_or_disjoint(DX0, DX2);  // dx0 may replace dx2 in place
    // Written: dqkv (in place), z1 (overwritten with dz1), dy0, dx0, the grads. Read-only: the rest.
    api::check_disjoint({DY0, DX0, GWO, GG1, GWGU, GWD, GG2, GWQ, GGQ, GGK},
                        {Y0, P, IF, X1, R1, X2, R2, Q, Z, DQ, Z1, WO, G1, WGU, WD, G2, WQ, GQ, GK});
    api::check_disjoint({DY0, GWO, GG1, GWGU, GWD, GG2, GWQ, GGQ, GGK}, {DX2});
    api::check_disjoint({DQ, Z1}, {Y0, P, IF, X1, R1, X2, R2, Q, Z, DX2, WO, G1, WGU, WD, G2, WQ, GQ, GK});
    BackwardPlan const plan = plan_backward(s, cfg, workspace);
    api::require_workspace("coda_block_backward", workspace, workspace_bytes, plan.total);
    require_workspace_disjoint(workspace, plan.total, y0->device,
                               {Y0, P, IF, X1, R1, Z1, X2, R2, Q, Z, DQ, DX2, DY0, DX0, WO, G1, WGU, WD, G2, WQ, GQ,
                                GK, GWO, GG1, GWGU, GWD, GG2, GWQ, GGQ, GGK});
    int const device = api::require_same_device({Y0, P, IF, X1, R1, Z1, X2, R2, Q, Z, DQ, DX2, DY0, DX0, WO, G1, WGU,
                                                 WD, G2, WQ, GQ, GK, GWO, GG1, GWGU, GWD, GG2, GWQ, GGQ, GGK});
    coda::ops::check_op_config();  // a bad CODA_OP_CONFIG is refused before any launch
    api::require_kernel_device(device, {Y0});

    coda_dtype const dt = Y0.dtype();
    coda_tensor a = view2d(plan.a, dt, s.M, s.d, s.d, device);
    coda_tensor y1 = view2d(plan.y1, dt, s.M, s.F, s.F, device);
    void* const ws = plan.op_ws;
    size_t const wsb = plan.op_ws_bytes;

    bool const fp16 = dt == CODA_FP16;
    auto const st = static_cast<cudaStream_t>(stream);
    // With no tokens only the weight gradients remain: zero (the GEMMs below, K = 0) and dgamma = 0 (empty sums).
    if (s.M == 0) {
      for (coda_tensor const* dg : {&g.gamma1, &g.gamma2, &g.q_gamma, &g.k_gamma}) {
        if (dg->data == nullptr) continue;  // q/k_gamma without QK-norm (unset)
        size_t const n = static_cast<size_t>(dg == &g.gamma1 || dg == &g.gamma2 ? s.d : cfg.head_dim);
        step("dgamma = 0 (no tokens)", [&] { CODA_CUDA_CHECK(cudaMemsetAsync(dg->data, 0, n * sizeof(float), st)); });
      }
    }
    // 1. rope_bwd_zdz: dz_qkv (over dqkv) and zdz2 = (1/d) <qkv, dqkv>; with QK-norm qk_norm_rope_bwd_zdz from the
    // saved pre-norm z, which also writes the q/k gamma gradients.
    if (s.M > 0 && qk_norm) {
      step("qk_norm_rope_bwd_zdz (QK-norm + RoPE backward)", [&] {
        coda::kernels::qk_norm_rope_bwd_zdz(
            coda::kernels::qk_norm_rope_bwd_args({.z = sv.z, .dqkv = *dqkv, .q_gamma = w.q_gamma,
                                                  .k_gamma = w.k_gamma, .positions = *positions,
                                                  .inv_freq = *inv_freq, .n_q_heads = cfg.n_q_heads,
                                                  .n_kv_heads = cfg.n_kv_heads, .head_dim = cfg.head_dim,
                                                  .eps = cfg.qk_eps, .hidden_size = s.d, .dz = *dqkv,
                                                  .zdz = plan.zdz2, .dq_gamma = static_cast<float*>(g.q_gamma.data),
                                                  .dk_gamma = static_cast<float*>(g.k_gamma.data), .workspace = ws}),
            st);
      });
    }
    if (s.M > 0) {
      if (!qk_norm) {
        step("rope_bwd_zdz (RoPE backward)", [&] {
          coda::kernels::rope_bwd_zdz(
              coda::kernels::rope_bwd_args({.qkv = sv.qkv, .dqkv = *dqkv, .positions = *positions,
                                            .inv_freq = *inv_freq, .n_q_heads = cfg.n_q_heads,
                                            .n_kv_heads = cfg.n_kv_heads, .head_dim = cfg.head_dim,
                                            .hidden_size = s.d, .dz = *dqkv, .zdz = plan.zdz2}),
              st);
        });
      }
      // 2. linear_residual_rmsnorm_bwd with W_qkv: dx2 (into dx0) = dx2_in + RMSNorm-2 backward of dz_qkv W_qkv; a2;
      // dgamma2.
      step("linear_residual_rmsnorm_bwd (q/k/v dgrad + RMSNorm 2 backward)", [&] {
        coda::ops::linear_residual_rmsnorm_bwd(
            s.M, s.d, s.W, dqkv->data, row_stride(*dqkv, s.W), w.w_qkv.data, row_stride(w.w_qkv, s.d), sv.x2.data,
            row_stride(sv.x2, s.d), w.gamma2.data, static_cast<float const*>(sv.rstd2.data), plan.zdz2,
            dx2 != nullptr ? dx2->data : nullptr, dx2 != nullptr ? row_stride(*dx2, s.d) : 0, 1.0f, dx0_out->data,
            row_stride(*dx0_out, s.d), plan.a, s.d, static_cast<float*>(g.gamma2.data), fp16, ws, wsb, st);
      });
    }
    // 3. dW_qkv = dz_qkv^T a2.
    coda_tensor const dq_t = transposed(*dqkv), a_t = transposed(a);
    step(coda_gemm(&dq_t, &a_t, &g.w_qkv, 1.0f, 0, ws, wsb, stream), "dW_qkv = dz_qkv^T a2");
    // 4. linear_swiglu_bwd_zdz with W_down: dz1 (over z1), y1, zdz1 from dx2.
    if (s.M > 0) {
      step("linear_swiglu_bwd_zdz (down dgrad + SwiGLU backward)", [&] {
        coda::ops::linear_swiglu_bwd_zdz(s.M, s.F, s.d, dx0_out->data, row_stride(*dx0_out, s.d), w.w_down.data,
                                         row_stride(w.w_down, s.F), sv.z1.data, row_stride(sv.z1, 2 * s.F),
                                         sv.z1.data, row_stride(sv.z1, 2 * s.F), plan.y1, s.F, plan.zdz1, fp16, ws,
                                         wsb, st);
      });
    }
    // 5. dW_down = dx2^T y1.
    coda_tensor const dx2_t = transposed(*dx0_out), y1_t = transposed(y1);
    step(coda_gemm(&dx2_t, &y1_t, &g.w_down, 1.0f, 0, ws, wsb, stream), "dW_down = dx2^T y1");
    // 6. linear_residual_rmsnorm_bwd with W_gu: dx1 = dx2 + RMSNorm-1 backward of dz1 W_gu (in place in dx0); a1;
    // dgamma1.
    if (s.M > 0) {
      step("linear_residual_rmsnorm_bwd (gate/up dgrad + RMSNorm 1 backward)", [&] {
        coda::ops::linear_residual_rmsnorm_bwd(
            s.M, s.d, 2 * s.F, sv.z1.data, row_stride(sv.z1, 2 * s.F), w.w_gu.data, row_stride(w.w_gu, s.d),
            sv.x1.data, row_stride(sv.x1, s.d), w.gamma1.data, static_cast<float const*>(sv.rstd1.data), plan.zdz1,
            dx0_out->data, row_stride(*dx0_out, s.d), 1.0f, dx0_out->data, row_stride(*dx0_out, s.d), plan.a, s.d,
            static_cast<float*>(g.gamma1.data), fp16, ws, wsb, st);
      });
    }
    // 7. dW_gu = dz1^T a1.
    coda_tensor const dz1_t = transposed(sv.z1);
    step(coda_gemm(&dz1_t, &a_t, &g.w_gu, 1.0f, 0, ws, wsb, stream), "dW_gu = dz1^T a1");
    // 8. dy0 = dx1 W_o (W_o^T as a column-major [hq hd, d] view).
    coda_tensor const wo_t = transposed(w.w_o);
    step(coda_gemm(dx0_out, &wo_t, dy0_out, 1.0f, 0, ws, wsb, stream), "dy0 = dx1 W_o");
    // 9. dW_o = dx1^T y0.
    coda_tensor const dx1_t = transposed(*dx0_out), y0_t = transposed(*y0);
    step(coda_gemm(&dx1_t, &y0_t, &g.w_o, 1.0f, 0, ws, wsb, stream), "dW_o = dx1^T y0");
  });
}

}  // extern "C"
