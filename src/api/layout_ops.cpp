// Weight layout helpers (MATH.md "Layouts"): row permutations done once at load/save time. Host tensors are
// permuted on the CPU; device tensors with strided cudaMemcpy2DAsync (no kernel, any CUDA device).
#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "runtime/device.hpp"

using coda::api::Arg;
using coda::api::guarded;
using coda::detail::fail;
namespace api = coda::api;

namespace {

struct RowCopy {
  char* dst;
  char const* src;
  bool on_device;
  size_t row_bytes;
  cudaStream_t stream;
  // dst rows dst_first + k*dst_step  <-  src rows src_first + k*src_step, k < count.
  void rows(int64_t dst_first, int64_t dst_step, int64_t src_first, int64_t src_step, int64_t count) const {
    if (count == 0) return;
    char* d = dst + dst_first * static_cast<int64_t>(row_bytes);
    char const* s = src + src_first * static_cast<int64_t>(row_bytes);
    size_t const dp = static_cast<size_t>(dst_step) * row_bytes, sp = static_cast<size_t>(src_step) * row_bytes;
    if (on_device) {
      CODA_CUDA_CHECK(cudaMemcpy2DAsync(d, dp, s, sp, row_bytes, static_cast<size_t>(count),
                                        cudaMemcpyDeviceToDevice, stream));
    } else {
      for (int64_t k = 0; k < count; ++k) std::memcpy(d + k * dp, s + k * sp, row_bytes);
    }
  }
};

// Validates (in, out) for a row permutation and returns the copier. `in` is [R, ...] or [R], contiguous; `out`
// the same shape and dtype, contiguous, disjoint. Both on the host (device -1) or both on the current CUDA device.
RowCopy prepare(Arg in, Arg out, void* stream, int64_t* rows) {
  api::require_tensor(in);
  api::require_tensor(out);
  if (in.t->rank < 1 || in.t->rank > 2) {
    fail(CODA_ERROR_SHAPE, in.name, ": expected rank 2 (a weight) or 1 (a bias), got rank ", in.t->rank);
  }
  api::require_dtype(in, {CODA_BF16, CODA_FP16, CODA_FP32});
  api::require_contiguous(in);
  api::require_rank(out, in.t->rank);
  api::require_same_dtype(out, in);
  for (int d = 0; d < in.t->rank; ++d) api::require_size(out, d, in.size(d), d == 0 ? "rows" : "columns", in.name);
  api::require_contiguous(out);
  api::require_no_overlap(out, in);
  if ((in.t->device < 0) != (out.t->device < 0) || (in.t->device >= 0 && in.t->device != out.t->device)) {
    fail(CODA_ERROR_DEVICE, out.name, ": is on device ", out.t->device, " but ", in.name, " is on device ",
         in.t->device, "; both must be host tensors (-1) or on one CUDA device");
  }
  bool const on_device = in.t->device >= 0;
  if (on_device) {
    int const current = coda::runtime::current_device_info().ordinal;
    if (current != in.t->device) {
      fail(CODA_ERROR_DEVICE, in.name, ": is on CUDA device ", in.t->device, " but the current device is ",
           current);
    }
  }
  *rows = in.size(0);
  size_t const cols = in.t->rank == 2 ? static_cast<size_t>(in.size(1)) : 1;
  return {static_cast<char*>(out.t->data), static_cast<char const*>(in.t->data), on_device,
          cols * coda_dtype_size(in.dtype()), static_cast<cudaStream_t>(stream)};
}

void check_even_rows(Arg in, int64_t rows) {
  if (rows % 2 != 0) fail(CODA_ERROR_SHAPE, in.name, ": sizes[0] = ", rows, " must be even (2F gate/up rows)");
}

void check_head_dim(Arg in, int64_t rows, int32_t head_dim) {
  if (head_dim < 2 || head_dim % 2 != 0) {
    fail(CODA_ERROR_INVALID_ARGUMENT, "head_dim: must be even and >= 2, got ", head_dim);
  }
  if (rows % head_dim != 0) {
    fail(CODA_ERROR_SHAPE, in.name, ": sizes[0] = ", rows, " must be a multiple of head_dim = ", head_dim);
  }
}

}  // namespace

extern "C" {

CODA_API coda_status coda_interleave_gate_up(const coda_tensor* w_stacked, coda_tensor* w_out, void* stream) {
  return guarded("coda_interleave_gate_up", [&] {
    int64_t rows = 0;
    RowCopy const c = prepare({w_stacked, "w_stacked"}, {w_out, "w_out"}, stream, &rows);
    check_even_rows({w_stacked, "w_stacked"}, rows);
    int64_t const F = rows / 2;
    c.rows(0, 2, 0, 1, F);  // gate i -> 2i
    c.rows(1, 2, F, 1, F);  // up i   -> 2i+1
  });
}

CODA_API coda_status coda_deinterleave_gate_up(const coda_tensor* w_interleaved, coda_tensor* w_out,
                                               void* stream) {
  return guarded("coda_deinterleave_gate_up", [&] {
    int64_t rows = 0;
    RowCopy const c = prepare({w_interleaved, "w_interleaved"}, {w_out, "w_out"}, stream, &rows);
    check_even_rows({w_interleaved, "w_interleaved"}, rows);
    int64_t const F = rows / 2;
    c.rows(0, 1, 0, 2, F);  // 2i   -> gate i
    c.rows(F, 1, 1, 2, F);  // 2i+1 -> up i
  });
}

CODA_API coda_status coda_pair_rope_rows(const coda_tensor* w, int32_t head_dim, coda_tensor* w_out,
                                         void* stream) {
  return guarded("coda_pair_rope_rows", [&] {
    int64_t rows = 0;
    RowCopy const c = prepare({w, "w"}, {w_out, "w_out"}, stream, &rows);
    check_head_dim({w, "w"}, rows, head_dim);
    int64_t const half = head_dim / 2;
    for (int64_t h = 0; h < rows; h += head_dim) {
      c.rows(h, 2, h, 1, half);         // old i         -> new 2i
      c.rows(h + 1, 2, h + half, 1, half);  // old i + hd/2 -> new 2i+1
    }
  });
}

CODA_API coda_status coda_unpair_rope_rows(const coda_tensor* w, int32_t head_dim, coda_tensor* w_out,
                                           void* stream) {
  return guarded("coda_unpair_rope_rows", [&] {
    int64_t rows = 0;
    RowCopy const c = prepare({w, "w"}, {w_out, "w_out"}, stream, &rows);
    check_head_dim({w, "w"}, rows, head_dim);
    int64_t const half = head_dim / 2;
    for (int64_t h = 0; h < rows; h += head_dim) {
      c.rows(h, 1, h, 2, half);             // new 2i   -> old i
      c.rows(h + half, 1, h + 1, 2, half);  // new 2i+1 -> old i + hd/2
    }
  });
}

}  // extern "C"
