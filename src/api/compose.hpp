// Helpers of the C entry points that are compositions of other ops (the block, the LM-head backward): views of
// temporaries carved from the caller's workspace, transposed and row-range views, and the step runner that turns a
// failing inner op into an error naming the step.
#pragma once

#include <coda/coda.h>

#include <cstdint>

#include "api/checks.hpp"
#include "common/error.hpp"

namespace coda::api {

/// Row-major [rows, cols] view with row stride ld over `data` on `device`.
inline coda_tensor view2d(void* data, coda_dtype dt, int64_t rows, int64_t cols, int64_t ld, int device) {
  coda_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.rank = 2;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = ld;
  t.strides[1] = 1;
  t.device = device;
  return t;
}

/// Contiguous [n] view (rank 1), or a rank-0 scalar when `scalar`.
inline coda_tensor view1d(void* data, coda_dtype dt, int64_t n, int device, bool scalar = false) {
  coda_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.rank = scalar ? 0 : 1;
  t.sizes[0] = scalar ? 0 : n;
  t.strides[0] = 1;
  t.device = device;
  return t;
}

/// The transpose of a row-major matrix as a column-major view (no copy): what coda_gemm takes for dz^T, a^T, W^T.
inline coda_tensor transposed(coda_tensor const& t) {
  coda_tensor r = t;
  r.sizes[0] = t.sizes[1];
  r.sizes[1] = t.sizes[0];
  r.strides[0] = 1;
  r.strides[1] = t.sizes[0] > 1 ? t.strides[0] : t.sizes[1];
  return r;
}

/// Rows [r0, r0 + rows) of a row-major matrix or a vector.
inline coda_tensor rows_of(coda_tensor const& t, int64_t r0, int64_t rows) {
  coda_tensor v = t;
  v.data = static_cast<char*>(t.data) + r0 * t.strides[0] * static_cast<int64_t>(coda_dtype_size(t.dtype));
  v.sizes[0] = rows;
  return v;
}

/// 256-byte aligned slots carved from a workspace; with a null base it only adds up the sizes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    void* const p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += round_up_256(bytes);
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

/// Runs one op's C entry point inside a composition: after the composition's own validation a failure here is a
/// CODA bug, reported with the step's name and the inner message.
inline void step(coda_status st, char const* what) {
  if (st != CODA_SUCCESS) detail::fail(st, "step ", what, " failed: ", coda_last_error());
}

/// Runs one op's internal entry (coda::ops / coda::kernels: no validation, the composition has done it once for the
/// whole) as a step: an error it throws (a CUDA failure, a refused CODA_OP_CONFIG pin) names the step.
template <class Run>
void step(char const* what, Run&& run) {
  try {
    run();
  } catch (detail::Error const& e) {
    detail::fail(e.status(), "step ", what, " failed: ", e.what());
  }
}

}  // namespace coda::api
