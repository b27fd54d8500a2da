// CODA C++ API: thin inline wrappers over the C ABI in coda.h.
//
// Error model: every function throws coda::Error (a std::runtime_error carrying the coda_status) when the C call
// fails; the message is the one coda_last_error() gives, naming the argument and the rule. Nothing is launched and
// no output is written when an Error is thrown from argument validation. There is exactly one implementation (the
// C functions); these wrappers add types, defaults and exceptions, nothing else.
//
// Shapes, dtypes, layouts, in-place behaviour and equations: see the matching coda_<op> in coda.h.
#ifndef CODA_OPS_HPP_
#define CODA_OPS_HPP_

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace coda {

/// The exception thrown by every C++ API function; status() is the C status code.
class Error : public std::runtime_error {
 public:
  Error(coda_status status, std::string const& message) : std::runtime_error(message), status_(status) {}
  coda_status status() const noexcept { return status_; }

 private:
  coda_status status_;
};

/// Throws coda::Error for a non-success status, with coda_last_error() as the message.
inline void check(coda_status status) {
  if (status != CODA_SUCCESS) {
    throw Error(status, std::string(coda_status_string(status)) + ": " + coda_last_error());
  }
}

/// A non-owning strided tensor view (layout-compatible with coda_tensor).
struct TensorView : coda_tensor {
  TensorView() : coda_tensor{nullptr, CODA_FP32, 0, {0, 0, 0, 0}, {0, 0, 0, 0}, -1} {}
  /// Contiguous row-major view of `shape` (rank = shape.size() <= 4) on `device_ordinal` (-1: host).
  TensorView(void* ptr, coda_dtype type, std::initializer_list<int64_t> shape, int device_ordinal) : TensorView() {
    data = ptr;
    dtype = type;
    device = device_ordinal;
    rank = static_cast<int32_t>(shape.size());
    if (rank > CODA_MAX_RANK) throw Error(CODA_ERROR_SHAPE, "TensorView: rank > CODA_MAX_RANK");
    int i = 0;
    for (int64_t s : shape) sizes[i++] = s;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= sizes[d];
    }
  }
  /// Same view with explicit strides (in elements).
  TensorView(void* ptr, coda_dtype type, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> element_strides, int device_ordinal)
      : TensorView(ptr, type, shape, device_ordinal) {
    if (element_strides.size() != shape.size()) throw Error(CODA_ERROR_SHAPE, "TensorView: strides rank != rank");
    int i = 0;
    for (int64_t s : element_strides) strides[i++] = s;
  }
  int64_t size(int d) const { return sizes[d]; }
  int64_t stride(int d) const { return strides[d]; }
  /// 2-D transpose view (swaps sizes and strides; no data moves).
  TensorView t() const {
    TensorView v = *this;
    if (rank != 2) throw Error(CODA_ERROR_SHAPE, "TensorView::t: rank must be 2");
    std::swap(v.sizes[0], v.sizes[1]);
    std::swap(v.strides[0], v.strides[1]);
    return v;
  }
};

/// Scratch memory for an op: pointer and size in bytes (nullptr/0 when the op needs none).
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

namespace detail {
inline coda_tensor const* c_arg(TensorView const& t) { return &t; }
inline coda_tensor* c_arg(TensorView& t) { return &t; }
template <class T>
T&& c_arg(T&& v) {  // scalars, streams, workspace pointers, nullptr for an optional tensor
  return static_cast<T&&>(v);
}
}  // namespace detail

/// Any C entry point with TensorViews for its tensor parameters, throwing coda::Error on failure: the generic form of
/// the named wrappers below (which add defaults and the Workspace pair), so an op is callable from C++ without one,
/// e.g. `coda::call(coda_linear_rowscale, h, w, rstd, y, nullptr, 0, stream)`. Arguments in the C order; a tensor
/// the C function takes as `const coda_tensor*` may be a const TensorView, an output must be a non-const one.
template <class... Params, class... Args>
void call(coda_status (*fn)(Params...), Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "coda::call: the C function takes another number of arguments");
  check(fn(detail::c_arg(static_cast<Args&&>(args))...));
}

// ---- library and device --------------------------------------------------------------------------------------
inline int version() { return coda_version(); }
/// True when `device` (-1: current) is sm_90. Throws coda::Error when no CUDA device/driver exists.
inline bool device_supported(int device = -1) {
  int supported = 0;
  check(coda_device_supported(device, &supported, nullptr, nullptr));
  return supported != 0;
}

// ---- forward ops --------------------------------------------------------------------------------------------
inline void linear_residual_rmsnorm(TensorView const& a, TensorView const& w, TensorView const& residual,
                                    TensorView const& gamma, float eps, TensorView& x_out, TensorView& h_out,
                                    TensorView& rstd_out, Workspace ws, cudaStream_t stream) {
  check(coda_linear_residual_rmsnorm(&a, &w, &residual, &gamma, eps, &x_out, &h_out, &rstd_out, ws.ptr, ws.bytes,
                                     stream));
}
inline size_t linear_residual_rmsnorm_workspace_size(int64_t M, int64_t N) {
  return coda_linear_residual_rmsnorm_workspace_size(M, N);
}
inline void rmsnorm_rstd(TensorView const& partials, int64_t n_features, float eps, TensorView& rstd_out,
                         cudaStream_t stream) {
  check(coda_rmsnorm_rstd(&partials, n_features, eps, &rstd_out, stream));
}
inline void rmsnorm_prepare(TensorView const& x, TensorView const& gamma, float eps, TensorView& h_out,
                            TensorView& rstd_out, cudaStream_t stream) {
  check(coda_rmsnorm_prepare(&x, &gamma, eps, &h_out, &rstd_out, stream));
}
inline void linear_rowscale(TensorView const& h, TensorView const& w, TensorView const& rstd, TensorView& y_out,
                            Workspace ws, cudaStream_t stream) {
  check(coda_linear_rowscale(&h, &w, &rstd, &y_out, ws.ptr, ws.bytes, stream));
}
inline void linear_rowscale_swiglu(TensorView const& h, TensorView const& w_gu, TensorView const& rstd,
                                   TensorView& z_out, TensorView& y_out, Workspace ws, cudaStream_t stream) {
  check(coda_linear_rowscale_swiglu(&h, &w_gu, &rstd, &z_out, &y_out, ws.ptr, ws.bytes, stream));
}
inline void linear_rowscale_rope(TensorView const& h, TensorView const& w_qkv, TensorView const& rstd,
                                 TensorView const& positions, TensorView const& inv_freq, int n_q_heads,
                                 int n_kv_heads, int head_dim, TensorView& qkv_out, Workspace ws,
                                 cudaStream_t stream) {
  check(coda_linear_rowscale_rope(&h, &w_qkv, &rstd, &positions, &inv_freq, n_q_heads, n_kv_heads, head_dim,
                                  &qkv_out, ws.ptr, ws.bytes, stream));
}
/// coda_linear_rowscale_qk_norm_rope: qkv and the pre-norm z; no workspace. (The C ABI also takes a
/// null z_out, forward only: call it directly for that.)
inline void linear_rowscale_qk_norm_rope(TensorView const& h, TensorView const& w_qkv, TensorView const& rstd,
                                         TensorView const& q_gamma, TensorView const& k_gamma,
                                         TensorView const& positions, TensorView const& inv_freq, int n_q_heads,
                                         int n_kv_heads, int head_dim, float qk_eps, TensorView& qkv_out,
                                         TensorView& z_out, cudaStream_t stream) {
  check(coda_linear_rowscale_qk_norm_rope(&h, &w_qkv, &rstd, &q_gamma, &k_gamma, &positions, &inv_freq, n_q_heads,
                                          n_kv_heads, head_dim, qk_eps, &qkv_out, &z_out, stream));
}
/// logits_out may be nullptr (logits not stored).
inline void linear_rowscale_lse(TensorView const& h, TensorView const& w, TensorView const& rstd,
                                TensorView const& targets, float softcap, int64_t ignore_index, TensorView& lse_out,
                                TensorView& target_logit_out, TensorView* logits_out, Workspace ws,
                                cudaStream_t stream) {
  check(coda_linear_rowscale_lse(&h, &w, &rstd, &targets, softcap, ignore_index, &lse_out, &target_logit_out,
                                 logits_out, ws.ptr, ws.bytes, stream));
}
/// grad_loss, dlogits_out, zdz_out may be nullptr (see coda_cross_entropy).
inline void cross_entropy(TensorView const& logits, TensorView const& targets, coda_ce_options const& options,
                          TensorView const* grad_loss, int64_t hidden_size, TensorView& loss_out,
                          TensorView* dlogits_out, TensorView* zdz_out, Workspace ws, cudaStream_t stream) {
  check(coda_cross_entropy(&logits, &targets, &options, grad_loss, hidden_size, &loss_out, dlogits_out, zdz_out,
                           ws.ptr, ws.bytes, stream));
}
/// LM head + cross-entropy loss without logits in memory (coda_linear_cross_entropy); lse_out may be nullptr,
/// chunk_rows 0 = the default.
inline void linear_cross_entropy(TensorView const& h, TensorView const& w, TensorView const& rstd,
                                 TensorView const& targets, coda_ce_options const& options, int64_t chunk_rows,
                                 TensorView& loss_out, TensorView* lse_out, Workspace ws, cudaStream_t stream) {
  check(coda_linear_cross_entropy(&h, &w, &rstd, &targets, &options, chunk_rows, &loss_out, lse_out, ws.ptr,
                                  ws.bytes, stream));
}
inline size_t linear_cross_entropy_workspace_size(int64_t M, int64_t V, int64_t chunk_rows = 0) {
  return coda_linear_cross_entropy_workspace_size(M, V, chunk_rows);
}

// ---- backward ops -------------------------------------------------------------------------------------------
inline void rope_bwd_zdz(TensorView const& qkv, TensorView const& dqkv, TensorView const& positions,
                         TensorView const& inv_freq, int n_q_heads, int n_kv_heads, int head_dim,
                         int64_t hidden_size, TensorView& dz_out, TensorView& zdz_out, cudaStream_t stream) {
  check(coda_rope_bwd_zdz(&qkv, &dqkv, &positions, &inv_freq, n_q_heads, n_kv_heads, head_dim, hidden_size,
                          &dz_out, &zdz_out, stream));
}
/// coda_qk_norm_rope_bwd_zdz, from coda_linear_rowscale_qk_norm_rope's z; dz_out may be dqkv (in place).
inline void qk_norm_rope_bwd_zdz(TensorView const& z, TensorView const& dqkv, TensorView const& q_gamma,
                                 TensorView const& k_gamma, TensorView const& positions, TensorView const& inv_freq,
                                 int n_q_heads, int n_kv_heads, int head_dim, float qk_eps, int64_t hidden_size,
                                 TensorView& dz_out, TensorView& zdz_out, TensorView& dq_gamma_out,
                                 TensorView& dk_gamma_out, Workspace ws, cudaStream_t stream) {
  check(coda_qk_norm_rope_bwd_zdz(&z, &dqkv, &q_gamma, &k_gamma, &positions, &inv_freq, n_q_heads, n_kv_heads,
                                  head_dim, qk_eps, hidden_size, &dz_out, &zdz_out, &dq_gamma_out, &dk_gamma_out,
                                  ws.ptr, ws.bytes, stream));
}
inline size_t qk_norm_rope_bwd_zdz_workspace_size(int64_t M, int64_t head_dim) {
  return coda_qk_norm_rope_bwd_zdz_workspace_size(M, head_dim);
}
/// dx_in may be nullptr (no incoming residual gradient).
inline void linear_residual_rmsnorm_bwd(TensorView const& dz, TensorView const& w, TensorView const& x,
                                        TensorView const& gamma, TensorView const& rstd, TensorView const& zdz,
                                        TensorView const* dx_in, float alpha, TensorView& dx_out, TensorView& a_out,
                                        TensorView& dgamma_out, Workspace ws, cudaStream_t stream) {
  check(coda_linear_residual_rmsnorm_bwd(&dz, &w, &x, &gamma, &rstd, &zdz, dx_in, alpha, &dx_out, &a_out,
                                         &dgamma_out, ws.ptr, ws.bytes, stream));
}
inline void linear_swiglu_bwd_zdz(TensorView const& dx, TensorView const& w_down, TensorView const& z,
                                  TensorView& dz_out, TensorView& y_out, TensorView& zdz_out, Workspace ws,
                                  cudaStream_t stream) {
  check(coda_linear_swiglu_bwd_zdz(&dx, &w_down, &z, &dz_out, &y_out, &zdz_out, ws.ptr, ws.bytes, stream));
}

// ---- plain GEMM and weight layouts ---------------------------------------------------------------------------
inline void gemm(TensorView const& a, TensorView const& b, TensorView& d, float alpha, bool accumulate,
                 Workspace ws, cudaStream_t stream) {
  check(coda_gemm(&a, &b, &d, alpha, accumulate ? 1 : 0, ws.ptr, ws.bytes, stream));
}
inline size_t gemm_workspace_size(int64_t M, int64_t N, int64_t K) { return coda_gemm_workspace_size(M, N, K); }
inline void interleave_gate_up(TensorView const& w_stacked, TensorView& w_out, cudaStream_t stream) {
  check(coda_interleave_gate_up(&w_stacked, &w_out, stream));
}
inline void deinterleave_gate_up(TensorView const& w_interleaved, TensorView& w_out, cudaStream_t stream) {
  check(coda_deinterleave_gate_up(&w_interleaved, &w_out, stream));
}
inline void pair_rope_rows(TensorView const& w, int head_dim, TensorView& w_out, cudaStream_t stream) {
  check(coda_pair_rope_rows(&w, head_dim, &w_out, stream));
}
inline void unpair_rope_rows(TensorView const& w, int head_dim, TensorView& w_out, cudaStream_t stream) {
  check(coda_unpair_rope_rows(&w, head_dim, &w_out, stream));
}

}  // namespace coda

#endif  // CODA_OPS_HPP_
