// Argument validation at the C ABI boundary. Every check throws coda::detail::Error with a message that names the
// argument and the rule; the kernels below assume arguments that passed.
#pragma once

#include <coda/coda.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/error.hpp"

namespace coda::api {

/// A tensor argument and its public name (the parameter name in coda.h), for messages.
struct Arg {
  coda_tensor const* t;
  char const* name;
  int64_t size(int d) const { return t->sizes[d]; }
  int64_t stride(int d) const { return t->strides[d]; }
  coda_dtype dtype() const { return t->dtype; }
};

char const* dtype_name(coda_dtype dtype);
std::string shape_string(coda_tensor const& t);

/// Non-null descriptor with a known dtype, rank in [0, CODA_MAX_RANK], sizes >= 0, strides >= 0, a naturally
/// aligned data pointer (element size), and a non-null
/// data pointer when it holds elements.
void require_tensor(Arg a);
void require_rank(Arg a, int rank);
void require_dtype(Arg a, std::initializer_list<coda_dtype> allowed);
void require_same_dtype(Arg a, Arg ref);
/// a.sizes[dim] == expected; `what` names the quantity (e.g. "K", "N") and `source` where expected comes from.
void require_size(Arg a, int dim, int64_t expected, char const* what, char const* source);
/// 2-D, unit stride along dim 1, row stride >= sizes[1] (rows may be padded).
void require_row_major(Arg a);
/// Dense row-major (any rank).
void require_contiguous(Arg a);
/// Data pointer and every non-unit stride 16-byte aligned (the TMA rule); sizes of the unit-stride dimension
/// 16-byte multiples when `inner_size_too`.
void require_tma_aligned(Arg a, bool inner_size_too);
/// All tensors on the same CUDA device (device >= 0); returns that device (-1 if none was given).
int require_same_device(std::initializer_list<Arg> args);
/// The byte ranges spanned by two tensors do not intersect.
void require_no_overlap(Arg a, Arg b);
/// a and b are either the very same view (same pointer, sizes, strides: an allowed in-place use) or disjoint.
void require_same_or_disjoint(Arg a, Arg b);
/// Number of elements (product of sizes).
int64_t numel(coda_tensor const& t);

/// The kernel device stage: a CUDA device exists, `device` is the current device, it is sm_90, and every data
/// pointer is device memory there. Throws CODA_ERROR_ARCH / CODA_ERROR_DEVICE.
void require_kernel_device(int device, std::initializer_list<Arg> args);

/// The workspace holds at least `needed` bytes (and is non-null and 256-byte aligned when needed > 0).
void require_workspace(char const* op, void const* workspace, size_t bytes, size_t needed);

/// Throws CODA_ERROR_NOT_IMPLEMENTED for a declared op whose kernel is not in this build.
[[noreturn]] void not_implemented(char const* op, char const* where);

}  // namespace coda::api
