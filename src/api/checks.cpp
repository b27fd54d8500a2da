#include "api/checks.hpp"

#include "ops/op_config.hpp"

#include <cmath>
#include <cstdlib>
#include <string>

namespace coda::api {

using detail::fail;

LinearShape check_linear(Arg a, Arg w) {
  require_tensor(a);
  require_tensor(w);
  require_rank(a, 2);
  require_rank(w, 2);
  require_dtype(a, {CODA_BF16, CODA_FP16});
  require_same_dtype(w, a);
  require_size(w, 1, a.size(1), "K", (std::string(a.name) + ".sizes[1]").c_str());
  if (a.size(1) == 0) fail(CODA_ERROR_SHAPE, a.name, ": K (sizes[1]) must be > 0");
  if (w.size(0) == 0) fail(CODA_ERROR_SHAPE, w.name, ": N (sizes[0]) must be > 0");
  require_row_major(a);
  require_row_major(w);
  require_tma_aligned(a, true);
  require_tma_aligned(w, true);
  return {a.size(0), w.size(0), a.size(1)};
}

LinearShape check_rowscale_inputs(Arg h, Arg w, Arg rstd) {
  LinearShape const s = check_linear(h, w);
  check_vector(rstd, s.M, {CODA_FP32}, "M", "h.sizes[0]");
  return s;
}

LinearShape check_dgrad(Arg dz, Arg w) {
  require_tensor(dz);
  require_tensor(w);
  require_rank(dz, 2);
  require_rank(w, 2);
  require_dtype(dz, {CODA_BF16, CODA_FP16});
  require_same_dtype(w, dz);
  require_size(w, 0, dz.size(1), "rows = dz features", "dz.sizes[1]");
  if (dz.size(1) == 0) fail(CODA_ERROR_SHAPE, dz.name, ": sizes[1] must be > 0");
  if (w.size(1) == 0) fail(CODA_ERROR_SHAPE, w.name, ": sizes[1] must be > 0");
  require_row_major(dz);
  require_row_major(w);
  require_tma_aligned(dz, true);
  require_tma_aligned(w, true);
  return {dz.size(0), w.size(1), dz.size(1)};
}

void check_activation(Arg t, Arg like, int64_t rows, int64_t cols, char const* rows_what, char const* cols_what) {
  require_tensor(t);
  require_rank(t, 2);
  require_same_dtype(t, like);
  require_size(t, 0, rows, rows_what, like.name);
  require_size(t, 1, cols, cols_what, "the op's shape");
  require_row_major(t);
  require_tma_aligned(t, true);
}

void check_vector(Arg t, int64_t n, std::initializer_list<coda_dtype> dtypes, char const* what,
                  char const* source) {
  require_tensor(t);
  require_rank(t, 1);
  require_dtype(t, dtypes);
  require_size(t, 0, n, what, source);
  require_contiguous(t);
}

void check_disjoint(std::initializer_list<Arg> outs, std::initializer_list<Arg> ins) {
  for (auto i = outs.begin(); i != outs.end(); ++i) {
    for (auto j = i + 1; j != outs.end(); ++j) require_no_overlap(*i, *j);
    for (Arg const& in : ins) require_no_overlap(*i, in);
  }
}

void check_qk_norm_args(Arg q_gamma, Arg k_gamma, int32_t head_dim, float eps, char const* eps_name) {
  for (Arg const& g : {q_gamma, k_gamma}) {
    check_vector(g, head_dim, {CODA_FP32}, "head_dim", "head_dim");
    if ((reinterpret_cast<uintptr_t>(g.t->data) & 7u) != 0) {
      fail(CODA_ERROR_MISALIGNED, g.name, ": data must be 8-byte aligned (read as float pairs)");
    }
  }
  check_eps(eps, eps_name);
}

void check_ce_options(coda_ce_options const& o) {
  if (o.reduction != CODA_REDUCTION_NONE && o.reduction != CODA_REDUCTION_MEAN && o.reduction != CODA_REDUCTION_SUM) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "options->reduction: unknown value ", static_cast<int>(o.reduction));
  }
  if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f)) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "options->label_smoothing: must be in [0, 1], got ", o.label_smoothing);
  }
  if (!(o.z_loss >= 0.0f) || !std::isfinite(o.z_loss)) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "options->z_loss: must be finite and >= 0, got ", o.z_loss);
  }
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "options->softcap: must be finite and >= 0 (0 = off), got ", o.softcap);
  }
}

void check_loss_out(Arg loss, int64_t M, bool per_row, char const* source) {
  require_tensor(loss);
  require_dtype(loss, {CODA_FP32});
  if (per_row) {
    check_vector(loss, M, {CODA_FP32}, "M", source);
  } else if (loss.t->rank != 0) {
    fail(CODA_ERROR_SHAPE, loss.name, ": must be a scalar (rank 0) for reduction mean/sum, got shape ",
         shape_string(*loss.t));
  }
}

void check_grad_loss(Arg grad_loss, int64_t M, bool per_row, char const* source) {
  if (grad_loss.t == nullptr) return;
  if (per_row) {
    check_vector(grad_loss, M, {CODA_FP32}, "M", source);
    return;
  }
  require_tensor(grad_loss);
  require_dtype(grad_loss, {CODA_FP32});
  if (grad_loss.t->rank != 0) {
    fail(CODA_ERROR_SHAPE, grad_loss.name, ": must be a scalar (rank 0) for reduction mean/sum, got shape ",
         shape_string(*grad_loss.t));
  }
}

void check_eps(float eps, char const* name) {
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    fail(CODA_ERROR_INVALID_ARGUMENT, name, ": must be finite and > 0, got ", eps);
  }
}

int require_fused_launch(std::initializer_list<Arg> tensors) {
  int const device = require_same_device(tensors);
  coda::ops::check_op_config();
  require_kernel_device(device, tensors);
  return device;
}

int64_t check_rope_input(Arg t, Arg positions, Arg inv_freq, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim) {
  require_tensor(t);
  require_rank(t, 2);
  require_dtype(t, {CODA_BF16, CODA_FP16});
  require_row_major(t);
  require_tma_aligned(t, true);
  int64_t const M = t.size(0);
  int64_t const width = check_rope_args(positions, inv_freq, n_q_heads, n_kv_heads, head_dim, M);
  require_size(t, 1, width, "(n_q_heads + 2*n_kv_heads)*head_dim", "the head counts");
  return M;
}

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t col_partials_bytes(int64_t M, int64_t N) {
  if (M <= 0 || N <= 0) return 0;
  size_t const tiles = static_cast<size_t>((M + 63) / 64);
  size_t const n_pad = static_cast<size_t>((N + 255) / 256 * 256);
  return round_up_256(tiles * n_pad * sizeof(float));
}

size_t row_partials_bytes(int64_t M, int64_t N) { return row_partials_bytes(M, N, 256, 128); }

size_t row_partials_bytes(int64_t M, int64_t N, int64_t tile_m, int64_t tile_n) {
  if (M <= 0 || N <= 0) return 0;
  size_t const tiles = static_cast<size_t>((N + tile_n - 1) / tile_n);
  size_t const m_pad = static_cast<size_t>((M + tile_m - 1) / tile_m * tile_m);
  return round_up_256(tiles * m_pad * sizeof(float));
}

// Shared by linear_rowscale_rope and rope_bwd_zdz (and their QK-norm twins): head counts, head_dim, positions [M] int32
// and inv_freq [head_dim/2] fp32; returns the qkv width (Hq + 2 Hkv) * head_dim.
int64_t check_rope_args(Arg positions, Arg inv_freq, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                        int64_t M) {
  if (head_dim != 64 && head_dim != 128) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "head_dim: must be 64 or 128, got ", head_dim);
  }
  if (n_q_heads < 1) fail(CODA_ERROR_INVALID_ARGUMENT, "n_q_heads: must be >= 1, got ", n_q_heads);
  if (n_kv_heads < 1) fail(CODA_ERROR_INVALID_ARGUMENT, "n_kv_heads: must be >= 1, got ", n_kv_heads);
  if (n_q_heads % n_kv_heads != 0) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "n_kv_heads: must divide n_q_heads (GQA), got n_q_heads = ", n_q_heads,
         ", n_kv_heads = ", n_kv_heads);
  }
  check_vector(positions, M, {CODA_INT32}, "M", "the row count");
  check_vector(inv_freq, head_dim / 2, {CODA_FP32}, "head_dim/2", "head_dim");
  return (static_cast<int64_t>(n_q_heads) + 2 * static_cast<int64_t>(n_kv_heads)) * head_dim;
}

}  // namespace coda::api
