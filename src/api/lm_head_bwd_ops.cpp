// C ABI of the LM head + cross-entropy backward (coda_linear_cross_entropy_bwd): validation of the whole call, then per
// chunk of rows linear_rowscale (recomputed logits) -> cross_entropy (dlogits in place, zdz) ->
// linear_residual_rmsnorm_bwd (dx, a, dgamma of the chunk) -> dW += dlogits^T a (fp32), so dlogits exist for one chunk
// at a time. The ops run through their own C entry points (a failure there, after this validation, is a CODA bug
// reported with the step) plus two tiny internal kernels (the mean's gradient scale over all rows, the fixed-order
// dgamma sum over chunks). Also coda_scale_cast, which the training step's backward applies to the fp32 weight gradient
// this call leaves.
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "api/checks.hpp"
#include "api/compose.hpp"
#include "api/guard.hpp"
#include "api/validate.hpp"
#include "gemm/kernel_api.hpp"
#include "kernels/kernels.hpp"
#include "ops/linear_residual_rmsnorm_bwd/kernels.hpp"
#include "ops/linear_rowscale_exp/kernels.hpp"
#include "ops/op_config.hpp"
#include "runtime/autotune.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::api::rows_of;
using coda::api::step;
using coda::api::transposed;
using coda::api::view1d;
using coda::api::view2d;
using coda::detail::fail;
namespace api = coda::api;

namespace {

constexpr int64_t kDefaultChunkRows = 2048;  // dlogits chunk at V = 128256: 0.5 GiB bf16; the GEMMs stay large

// Any V: the GEMMs' TMA operands need V % 8 == 0 where V is a contiguous extent (the logits' row, the dgrad's K, dW's M
// in dlogits^T). Otherwise the chunk runs on Vp = V rounded up to 8: a copy of w with Vp - V zero rows gives logits
// that are exactly 0 in the pad columns, cross_entropy reads and writes only the V real ones (so the pad columns stay 0
// and add nothing to the dgrad), and dW's last V % 8 rows come from an 8-row GEMM into a small fp32 tail.
int64_t padded_vocab(int64_t V) { return (V + 7) / 8 * 8; }

int64_t chunk_of(int64_t M, int64_t chunk_rows) {
  int64_t const c = chunk_rows == 0 ? kDefaultChunkRows : chunk_rows;
  return std::max<int64_t>(1, std::min(c, M));
}

// The exponential form (MATH.md `cross_entropy`, "exponential form"): bf16 without label smoothing. Per chunk
// ce_exp_offset -> the ExpCe logits GEMM (E = s exp(c - K) stored where the logits go) -> ce_exp_finish ->
// ce_exp_rescue -> linear_residual_rmsnorm_bwd with the row scale v -> the same dW GEMM on E. No pass over [C, V]
// between the GEMMs (cross_entropy reads the logits twice and writes dlogits). The default for those; CODA_LCE_LOGITS=1
// forces the logits path (linear_rowscale -> cross_entropy -> linear_residual_rmsnorm_bwd), which fp16 and label
// smoothing always take. The target entry E_t is stored as bf16 and its residual lo is added to dW's target rows after
// each chunk's wgrad (ce_exp_target_fix), so dW's target column sees E_t to fp32; dx and dgamma take R(E_t) through
// linear_residual_rmsnorm_bwd, and a_w = R(v c gamma) stays one bf16 rounding (MATH.md `cross_entropy`, exponential
// form).
bool exponential_form(coda_dtype dt, coda_ce_options const& o) {
  return dt == CODA_BF16 && o.label_smoothing == 0.0f && !coda::runtime::env_flag("CODA_LCE_LOGITS");
}

struct Plan {
  float* g = nullptr;        // [1] mean's gradient scale
  void* logits = nullptr;    // [C, Vp] logits, then dlogits
  void* w_pad = nullptr;     // [Vp, d] w with zero rows, only when V % 8 != 0
  float* dw_tail = nullptr;  // [8, d] dW rows [V8, V8 + 8) (those >= V are discarded), only when V % 8 != 0
  void* a = nullptr;         // [C, d]
  float* zdz = nullptr;      // [C]
  float* loss_rows = nullptr;  // [M] per-row losses (reduced into loss_out for mean/sum)
  unsigned long long* count = nullptr;  // the mean's non-ignored row count
  float* dgamma = nullptr;   // [chunks, d] per-chunk dgamma
  float* offset = nullptr;   // [C] exponential form: K, l_t, v, the flagged rows and their count, the GEMM's partials
  float* target_logit = nullptr;
  float* target_e = nullptr;
  float* target_lo = nullptr;
  float* v = nullptr;
  int* flagged = nullptr;
  unsigned* flag_count = nullptr;
  void* exp_parts = nullptr;
  size_t exp_parts_bytes = 0;
  void* op_ws = nullptr;
  size_t op_ws_bytes = 0;
  size_t total = 0;
};

Plan plan(int64_t M, int64_t V, int64_t d, int64_t chunk_rows, void* workspace) {
  Plan p{};
  if (M <= 0) return p;
  int64_t const C = chunk_of(M, chunk_rows), chunks = (M + C - 1) / C;
  api::Carver carve(workspace);
  auto take = [&](size_t bytes) { return carve.take(bytes); };
  p.g = static_cast<float*>(take(sizeof(float)));
  int64_t const Vp = padded_vocab(V);
  p.logits = take(static_cast<size_t>(C * Vp) * 2);
  if (Vp != V) {
    p.w_pad = take(static_cast<size_t>(Vp * d) * 2);
    p.dw_tail = static_cast<float*>(take(static_cast<size_t>(8 * d) * 4));
  }
  p.a = take(static_cast<size_t>(C * d) * 2);
  p.zdz = static_cast<float*>(take(static_cast<size_t>(C) * 4));
  p.loss_rows = static_cast<float*>(take(static_cast<size_t>(M) * 4));
  p.count = static_cast<unsigned long long*>(take(sizeof(unsigned long long)));
  p.dgamma = static_cast<float*>(take(static_cast<size_t>(chunks * d) * 4));
  p.offset = static_cast<float*>(take(static_cast<size_t>(C) * 4));
  p.target_logit = static_cast<float*>(take(static_cast<size_t>(C) * 4));
  p.target_e = static_cast<float*>(take(static_cast<size_t>(C) * 4));
  p.target_lo = static_cast<float*>(take(static_cast<size_t>(C) * 4));
  p.v = static_cast<float*>(take(static_cast<size_t>(C) * 4));
  p.flagged = static_cast<int*>(take(static_cast<size_t>(C) * 4));
  p.flag_count = static_cast<unsigned*>(take(sizeof(unsigned)));
  p.exp_parts_bytes = coda::ops::exp_ce_workspace(C, Vp, V).bytes();
  p.exp_parts = take(p.exp_parts_bytes);
  // dW's GEMMs: [V8, d] and, for V % 8 != 0, the [8, d] tail (a skinny problem may take a stream-K workspace).
  p.op_ws_bytes = std::max({coda_linear_rowscale_workspace_size(C, Vp), coda_cross_entropy_workspace_size(C, V),
                            coda_linear_residual_rmsnorm_bwd_workspace_size(C, d), coda_gemm_workspace_size(Vp, d, C),
                            coda_gemm_workspace_size(V / 8 * 8, d, C), coda_gemm_workspace_size(8, d, C)});
  p.op_ws = take(p.op_ws_bytes);
  p.total = carve.used();
  return p;
}

}  // namespace

extern "C" {

CODA_API size_t coda_linear_cross_entropy_bwd_workspace_size(int64_t M, int64_t V, int64_t d, int64_t chunk_rows) {
  if (M < 0 || V <= 0 || d <= 0 || chunk_rows < 0) return 0;
  return plan(M, V, d, chunk_rows, nullptr).total;
}

CODA_API coda_status coda_linear_cross_entropy_bwd(const coda_tensor* h, const coda_tensor* w,
                                                   const coda_tensor* rstd, const coda_tensor* x,
                                                   const coda_tensor* gamma, const coda_tensor* targets,
                                                   const coda_ce_options* options, const coda_tensor* grad_loss,
                                                   int64_t chunk_rows, const coda_tensor* dx_in, coda_tensor* dx_out,
                                                   coda_tensor* dw_out, coda_tensor* dgamma_out,
                                                   coda_tensor* loss_out, void* workspace, size_t workspace_bytes,
                                                   void* stream) {
  return guarded("coda_linear_cross_entropy_bwd", [&] {
    Arg const Hh{h, "h"}, W{w, "w"}, S{rstd, "rstd"}, X{x, "x"}, G{gamma, "gamma"}, T{targets, "targets"};
    Arg const GL{grad_loss, "grad_loss"}, DXI{dx_in, "dx_in"}, DX{dx_out, "dx_out"}, DW{dw_out, "dw_out"};
    Arg const DG{dgamma_out, "dgamma_out"}, L{loss_out, "loss_out"};
    coda_ce_options const o = options != nullptr ? *options : coda_ce_options_default();
    api::LinearShape const s = api::check_linear(Hh, W);  // M, N = V, K = d
    int64_t const M = s.M, V = s.N, d = s.K, Vp = padded_vocab(V), V8 = V / 8 * 8;
    api::check_vector(S, M, {CODA_FP32}, "M", "h.sizes[0]");
    api::check_activation(X, Hh, M, d, "M = h.sizes[0]", "d = h.sizes[1]");
    api::check_vector(G, d, {Hh.dtype()}, "d", "h.sizes[1]");
    api::check_vector(T, M, {CODA_INT32, CODA_INT64}, "M", "h.sizes[0]");
    api::check_ce_options(o);
    bool const per_row = o.reduction == CODA_REDUCTION_NONE;
    api::check_grad_loss(GL, M, per_row, "h.sizes[0] (reduction none)");
    if (chunk_rows < 0) fail(CODA_ERROR_INVALID_ARGUMENT, "chunk_rows: must be >= 1, or 0 for the default, got ", chunk_rows);
    if (dx_in != nullptr) api::check_activation(DXI, Hh, M, d, "M", "d");
    api::check_activation(DX, Hh, M, d, "M", "d");
    api::require_tensor(DW);
    api::require_rank(DW, 2);
    api::require_dtype(DW, {CODA_FP32});
    api::require_size(DW, 0, V, "V", "w.sizes[0]");
    api::require_size(DW, 1, d, "d", "w.sizes[1]");
    api::require_row_major(DW);
    api::require_tma_aligned(DW, true);
    api::check_vector(DG, d, {CODA_FP32}, "d", "h.sizes[1]");
    if (loss_out != nullptr) api::check_loss_out(L, M, per_row, "h.sizes[0] (reduction none)");
    api::require_same_or_disjoint(DX, DXI);  // the residual gradient accumulated in place
    api::check_disjoint({DX, DW, DG, L}, {Hh, W, S, X, G, T, GL});
    api::check_disjoint({DW, DG, L}, {DXI});
    Plan const p = plan(M, V, d, chunk_rows, workspace);
    api::require_workspace("coda_linear_cross_entropy_bwd", workspace, workspace_bytes, p.total);
    int const device = api::require_fused_launch({Hh, W, S, X, G, T, GL, DXI, DX, DW, DG, L});
    auto const st = static_cast<cudaStream_t>(stream);

    if (M == 0) {  // empty sums: dW = 0, dgamma = 0; dx = dx_in (or 0)
      CODA_CUDA_CHECK(cudaMemset2DAsync(dw_out->data, static_cast<size_t>(V > 1 ? DW.stride(0) : d) * 4, 0,
                                        static_cast<size_t>(d) * 4, static_cast<size_t>(V), st));
      CODA_CUDA_CHECK(cudaMemsetAsync(dgamma_out->data, 0, static_cast<size_t>(d) * 4, st));
      if (loss_out != nullptr && !per_row) CODA_CUDA_CHECK(cudaMemsetAsync(loss_out->data, 0, sizeof(float), st));
      return;
    }
    coda_dtype const dt = Hh.dtype();
    bool const targets64 = T.dtype() == CODA_INT64;
    int64_t const C = chunk_of(M, chunk_rows), chunks = (M + C - 1) / C;
    size_t const es = coda_dtype_size(dt);
    coda_tensor w_use = *w;  // [Vp, d]: w itself, or its zero-padded copy
    if (Vp != V) {
      CODA_CUDA_CHECK(cudaMemcpy2DAsync(p.w_pad, static_cast<size_t>(d) * es, w->data,
                                        static_cast<size_t>(V > 1 ? W.stride(0) : d) * es,
                                        static_cast<size_t>(d) * es, static_cast<size_t>(V),
                                        cudaMemcpyDeviceToDevice, st));
      CODA_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(p.w_pad) + static_cast<size_t>(V * d) * es, 0,
                                      static_cast<size_t>((Vp - V) * d) * es, st));
      w_use = view2d(p.w_pad, dt, Vp, d, d, device);
    }

    // The gradient each row's loss receives: mean -> one scale over all rows (then "sum" per chunk); sum -> the
    // caller's scalar; none -> the caller's per-row vector, chunk by chunk. cross_entropy runs with reduction none on
    // each chunk (per-row losses into loss_rows, or straight into loss_out for none), the gradient scale given as one
    // scalar for mean/sum.
    float const* const gl = grad_loss != nullptr ? static_cast<float const*>(grad_loss->data) : nullptr;
    float const* g_all = gl;
    if (o.reduction == CODA_REDUCTION_MEAN) {
      coda::kernels::ce_mean_grad_scale(targets->data, targets64, M, o.ignore_index, gl, p.g, st);
      g_all = p.g;
    }
    float* const loss_rows = per_row && loss_out != nullptr ? static_cast<float*>(loss_out->data) : p.loss_rows;
    bool const exp_form = exponential_form(dt, o);
    int const sm_count = exp_form ? coda::gemm::device_sm_count(device) : 0;
    int64_t const ld_h = M > 1 ? Hh.stride(0) : d, ld_x = M > 1 ? X.stride(0) : d, ld_dx = M > 1 ? DX.stride(0) : d;
    int64_t const ld_dx_in = dx_in != nullptr && M > 1 ? DXI.stride(0) : d;
    int64_t const ld_w = Vp != V ? d : (V > 1 ? W.stride(0) : d);
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t const r0 = c * C, rows = std::min(C, M - r0);
      coda_tensor const h_c = rows_of(*h, r0, rows), x_c = rows_of(*x, r0, rows);
      coda_tensor const rstd_c = rows_of(*rstd, r0, rows), t_c = rows_of(*targets, r0, rows);
      coda_tensor logits = view2d(p.logits, dt, rows, Vp, Vp, device);
      coda_tensor a = view2d(p.a, dt, rows, d, d, device);
      coda_tensor zdz = view1d(p.zdz, CODA_FP32, rows, device);
      coda_tensor dgamma_c = view1d(p.dgamma + c * d, CODA_FP32, d, device);
      coda_tensor dx_c = rows_of(*dx_out, r0, rows);
      coda_tensor dx_in_c{};
      if (dx_in != nullptr) dx_in_c = rows_of(*dx_in, r0, rows);

      if (exp_form) {
        coda::kernels::CeExpArgs ce;
        ce.M = rows, ce.V = V, ce.d = d;
        ce.h = h_c.data, ce.ldh = ld_h;
        ce.w = w_use.data, ce.ldw = ld_w;
        ce.rstd = static_cast<float const*>(rstd_c.data);
        ce.targets = t_c.data, ce.targets_int64 = targets64;
        ce.ignore_index = o.ignore_index;
        ce.softcap = o.softcap, ce.z_loss = o.z_loss;
        ce.grad_loss = per_row ? (gl != nullptr ? gl + r0 : nullptr) : g_all;
        ce.grad_loss_scalar = !per_row;
        ce.offset = p.offset;
        ce.target_logit = p.target_logit;
        ce.target_e = p.target_e;
        ce.target_lo = p.target_lo;
        ce.e = p.logits, ce.ld_e = Vp;
        ce.loss = loss_rows + r0;
        ce.v = p.v;
        ce.zdz = p.zdz;
        ce.flagged = p.flagged, ce.flag_count = p.flag_count;
        coda::kernels::ce_exp_offset(ce, st);
        coda::ops::ExpCeArgs ea;
        ea.rstd = ce.rstd;
        ea.softcap = o.softcap;
        ea.offset = p.offset;
        ea.vocab = V;
        ea.target_e = p.target_e;
        ea.targets = ce.targets, ea.targets_int64 = targets64;
        coda::ops::ExpCeWorkspace const ws = coda::ops::linear_rowscale_exp(
            rows, Vp, d, h_c.data, ld_h, w_use.data, ld_w, ea, p.logits, Vp, p.exp_parts, p.exp_parts_bytes, st);
        ce.tiles = ws.tiles, ce.ld = ws.m_pad;
        ce.part_sumexp = ws.buffer(p.exp_parts, 0);
        ce.part_dot = ws.buffer(p.exp_parts, 1);
        coda::kernels::ce_exp_finish(ce, st);
        coda::kernels::ce_exp_rescue(ce, sm_count, st);
        coda::ops::linear_residual_rmsnorm_bwd(
            rows, d, Vp, p.logits, Vp, w_use.data, ld_w, x_c.data, ld_x, gamma->data, ce.rstd, p.zdz,
            dx_in != nullptr ? dx_in_c.data : nullptr, ld_dx_in, 1.0f, dx_c.data, ld_dx, p.a, d,
            static_cast<float*>(dgamma_c.data), false, p.op_ws, p.op_ws_bytes, st, p.v);
      } else {
        step(coda_linear_rowscale(&h_c, &w_use, &rstd_c, &logits, p.op_ws, p.op_ws_bytes, stream),
             "linear_rowscale (logits)");
        coda::kernels::CrossEntropyArgs ce;
        ce.dtype = dt;
        ce.M = rows, ce.V = V;
        ce.logits = p.logits, ce.ld_logits = Vp;
        ce.targets = t_c.data, ce.targets_int64 = targets64;
        ce.options = o;
        ce.options.reduction = CODA_REDUCTION_NONE;
        ce.grad_loss = per_row ? (gl != nullptr ? gl + r0 : nullptr) : g_all;
        ce.grad_loss_scalar = !per_row;
        ce.hidden_size = d;
        ce.loss = loss_rows + r0;
        ce.dlogits = p.logits, ce.ld_dlogits = Vp;
        ce.zdz = p.zdz;
        ce.workspace = p.op_ws;
        coda::kernels::cross_entropy(ce, st);  // per-row loss, dlogits in place, zdz
        step(coda_linear_residual_rmsnorm_bwd(&logits, &w_use, &x_c, gamma, &rstd_c, &zdz,
                                              dx_in != nullptr ? &dx_in_c : nullptr, 1.0f, &dx_c, &a, &dgamma_c,
                                              p.op_ws, p.op_ws_bytes, stream),
             "linear_residual_rmsnorm_bwd (dgrad + final RMSNorm backward)");
      }
      coda_tensor const a_t = transposed(a);
      if (V8 > 0) {
        coda_tensor const dl_t = transposed(view2d(p.logits, dt, rows, V8, Vp, device));
        coda_tensor dw_main = rows_of(*dw_out, 0, V8);
        step(coda_gemm(&dl_t, &a_t, &dw_main, 1.0f, c > 0 ? 1 : 0, p.op_ws, p.op_ws_bytes, stream),
             "dW += dlogits^T a");
      }
      if (Vp != V) {
        coda_tensor const tail_t = transposed(view2d(static_cast<char*>(p.logits) + V8 * es, dt, rows, 8, Vp, device));
        coda_tensor tail = view2d(p.dw_tail, CODA_FP32, 8, d, d, device);
        step(coda_gemm(&tail_t, &a_t, &tail, 1.0f, c > 0 ? 1 : 0, p.op_ws, p.op_ws_bytes, stream),
             "dW tail += dlogits^T a");
      }
      if (exp_form) {  // E's target entries exactly: their bf16 residuals times a, added after the wgrad
        coda::kernels::CeTargetFixArgs fix;
        fix.M = rows, fix.V = V, fix.d = d;
        fix.targets = t_c.data, fix.targets_int64 = targets64;
        fix.lo = p.target_lo;
        fix.a = p.a, fix.ld_a = d;
        fix.dw = static_cast<float*>(dw_out->data), fix.ld_dw = V > 1 ? DW.stride(0) : d;
        fix.V8 = V8;
        fix.dw_tail = Vp != V ? p.dw_tail : nullptr;
        coda::kernels::ce_exp_target_fix(fix, st);
      }
    }
    if (Vp != V) {
      int64_t const ldw = V > 1 ? DW.stride(0) : d;
      CODA_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dw_out->data) + V8 * ldw * 4, static_cast<size_t>(ldw) * 4,
                                        p.dw_tail, static_cast<size_t>(d) * 4,
                                        static_cast<size_t>(d) * 4, static_cast<size_t>(V - V8),
                                        cudaMemcpyDeviceToDevice, st));
    }
    coda::kernels::column_sum(p.dgamma, chunks, d, d, static_cast<float*>(dgamma_out->data), st);
    if (loss_out != nullptr && !per_row) {
      coda::kernels::ce_reduce_rows(p.loss_rows, M, targets->data, targets64, o.ignore_index,
                                    o.reduction == CODA_REDUCTION_MEAN, p.count, static_cast<float*>(loss_out->data),
                                    st);
    }
  });
}

CODA_API coda_status coda_scale_cast(const coda_tensor* src, const coda_tensor* scale, coda_tensor* out, void* stream) {
  return guarded("coda_scale_cast", [&] {
    Arg const S{src, "src"}, G{scale, "scale"}, O{out, "out"};
    api::require_tensor(S);
    api::require_tensor(G);
    api::require_tensor(O);
    api::require_dtype(S, {CODA_FP32});
    api::require_dtype(G, {CODA_FP32});
    api::require_dtype(O, {CODA_BF16, CODA_FP16});
    if (api::numel(*scale) != 1) {
      fail(CODA_ERROR_SHAPE, "scale: must hold exactly one element (e.g. [] or [1]), got ", api::shape_string(*scale));
    }
    if (out->rank != src->rank || !std::equal(src->sizes, src->sizes + src->rank, out->sizes)) {
      fail(CODA_ERROR_SHAPE, "out: sizes ", api::shape_string(*out), " must equal src's ", api::shape_string(*src));
    }
    api::require_contiguous(S);
    api::require_contiguous(O);
    api::require_no_overlap(O, S);
    api::require_no_overlap(O, G);
    int const device = api::require_same_device({S, G, O});
    api::require_kernel_device(device, {S, G, O});
    int64_t const n = api::numel(*src);
    if (n == 0) return;
    coda::kernels::scale_cast(static_cast<float const*>(src->data), static_cast<float const*>(scale->data),
                              out->dtype, out->data, n, static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
