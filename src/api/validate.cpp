#include "api/validate.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>

#include "runtime/device.hpp"

namespace coda::api {

using detail::fail;

char const* dtype_name(coda_dtype dtype) {
  switch (dtype) {
    case CODA_BF16: return "bf16";
    case CODA_FP16: return "fp16";
    case CODA_FP32: return "fp32";
    case CODA_INT32: return "int32";
    case CODA_INT64: return "int64";
  }
  return "unknown";
}

std::string shape_string(coda_tensor const& t) {
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < t.rank; ++d) os << (d ? "," : "") << t.sizes[d];
  os << "]";
  return os.str();
}

int64_t numel(coda_tensor const& t) {
  int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.sizes[d];
  return n;
}

void require_tensor(Arg a) {
  if (a.t == nullptr) fail(CODA_ERROR_INVALID_ARGUMENT, a.name, ": tensor descriptor is NULL");
  if (coda_dtype_size(a.t->dtype) == 0) {
    fail(CODA_ERROR_DTYPE, a.name, ": unknown dtype value ", static_cast<int>(a.t->dtype));
  }
  if (a.t->rank < 0 || a.t->rank > CODA_MAX_RANK) {
    fail(CODA_ERROR_SHAPE, a.name, ": rank ", a.t->rank, " is outside [0, ", CODA_MAX_RANK, "]");
  }
  for (int d = 0; d < a.t->rank; ++d) {
    if (a.t->sizes[d] < 0) fail(CODA_ERROR_SHAPE, a.name, ": sizes[", d, "] = ", a.t->sizes[d], " is negative");
    if (a.t->strides[d] < 0) {
      fail(CODA_ERROR_LAYOUT, a.name, ": strides[", d, "] = ", a.t->strides[d],
           " is negative (negative strides are not supported; make the tensor contiguous)");
    }
  }
  if (a.t->data == nullptr && numel(*a.t) > 0) fail(CODA_ERROR_INVALID_ARGUMENT, a.name, ": data pointer is NULL");
  // Every element access needs natural alignment (an int64 target at an odd address faults on the device).
  size_t const es = coda_dtype_size(a.t->dtype);
  if (reinterpret_cast<uintptr_t>(a.t->data) % es != 0) {
    fail(CODA_ERROR_MISALIGNED, a.name, ": data pointer is not aligned to its ", es, "-byte ",
         dtype_name(a.t->dtype), " elements");
  }
}

void require_rank(Arg a, int rank) {
  if (a.t->rank != rank) {
    fail(CODA_ERROR_SHAPE, a.name, ": expected rank ", rank, ", got rank ", a.t->rank, " (shape ",
         shape_string(*a.t), ")");
  }
}

void require_dtype(Arg a, std::initializer_list<coda_dtype> allowed) {
  if (std::find(allowed.begin(), allowed.end(), a.t->dtype) != allowed.end()) return;
  std::string list;
  for (coda_dtype d : allowed) list += std::string(list.empty() ? "" : " or ") + dtype_name(d);
  fail(CODA_ERROR_DTYPE, a.name, ": dtype must be ", list, ", got ", dtype_name(a.t->dtype));
}

void require_same_dtype(Arg a, Arg ref) {
  if (a.t->dtype != ref.t->dtype) {
    fail(CODA_ERROR_DTYPE, a.name, ": dtype ", dtype_name(a.t->dtype), " must match ", ref.name, " (",
         dtype_name(ref.t->dtype), ")");
  }
}

void require_size(Arg a, int dim, int64_t expected, char const* what, char const* source) {
  if (a.t->sizes[dim] != expected) {
    fail(CODA_ERROR_SHAPE, a.name, ": sizes[", dim, "] (", what, ") must be ", expected, " as given by ", source,
         ", got ", a.t->sizes[dim], " (shape ", shape_string(*a.t), ")");
  }
}

void require_row_major(Arg a) {
  require_rank(a, 2);
  if (a.t->sizes[1] > 1 && a.t->strides[1] != 1) {
    fail(CODA_ERROR_LAYOUT, a.name, ": must be row-major (strides[1] == 1), got strides [", a.t->strides[0], ",",
         a.t->strides[1], "]; pass a contiguous tensor");
  }
  if (a.t->sizes[0] > 1 && a.t->strides[0] < a.t->sizes[1]) {
    fail(CODA_ERROR_LAYOUT, a.name, ": row stride ", a.t->strides[0], " is smaller than the row length ",
         a.t->sizes[1], " (rows would overlap)");
  }
}

void require_contiguous(Arg a) {
  int64_t expected = 1;
  for (int d = a.t->rank - 1; d >= 0; --d) {
    if (a.t->sizes[d] > 1 && a.t->strides[d] != expected) {
      fail(CODA_ERROR_LAYOUT, a.name, ": must be contiguous (dense row-major); strides[", d, "] = ", a.t->strides[d],
           " but ", expected, " expected for shape ", shape_string(*a.t));
    }
    expected *= a.t->sizes[d];
  }
}

void require_tma_aligned(Arg a, bool inner_size_too) {
  size_t const es = coda_dtype_size(a.t->dtype);
  auto const addr = reinterpret_cast<uintptr_t>(a.t->data);
  if (addr % 16 != 0) {
    fail(CODA_ERROR_MISALIGNED, a.name, ": data pointer 0x", std::hex, addr, std::dec,
         " is not 16-byte aligned (TMA rule); allocate with cudaMalloc or use an aligned offset");
  }
  for (int d = 0; d < a.t->rank; ++d) {
    bool const unit = a.t->strides[d] == 1;
    if (!unit && a.t->sizes[d] > 1 && (a.t->strides[d] * static_cast<int64_t>(es)) % 16 != 0) {
      fail(CODA_ERROR_MISALIGNED, a.name, ": strides[", d, "] = ", a.t->strides[d], " elements (",
           a.t->strides[d] * static_cast<int64_t>(es), " bytes) is not a multiple of 16 bytes (TMA rule: ",
           16 / es, " elements for ", dtype_name(a.t->dtype), ")");
    }
    if (unit && inner_size_too && (a.t->sizes[d] * static_cast<int64_t>(es)) % 16 != 0) {
      fail(CODA_ERROR_MISALIGNED, a.name, ": sizes[", d, "] = ", a.t->sizes[d],
           " is not a multiple of ", 16 / es, " elements (16 bytes of ", dtype_name(a.t->dtype),
           ", TMA rule); pad the feature dimension");
    }
  }
}

int require_same_device(std::initializer_list<Arg> args) {
  int device = -1;
  char const* first = nullptr;
  for (Arg const& a : args) {
    if (a.t == nullptr) continue;
    if (a.t->device < 0) {
      fail(CODA_ERROR_DEVICE, a.name, ": is a host tensor (device ", a.t->device,
           "); kernels need CUDA device memory");
    }
    if (first == nullptr) {
      device = a.t->device;
      first = a.name;
    } else if (a.t->device != device) {
      fail(CODA_ERROR_DEVICE, a.name, ": is on CUDA device ", a.t->device, " but ", first, " is on device ", device,
           "; all tensors must be on one device");
    }
  }
  return device;
}

namespace {
struct Span {
  uintptr_t lo, hi;  // [lo, hi) in bytes; empty when lo == hi
};
Span byte_span(coda_tensor const& t) {
  if (numel(t) == 0 || t.data == nullptr) return {0, 0};
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.sizes[d] - 1) * t.strides[d];
  auto const lo = reinterpret_cast<uintptr_t>(t.data);
  return {lo, lo + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(coda_dtype_size(t.dtype)))};
}
bool same_view(coda_tensor const& a, coda_tensor const& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d) {
    if (a.sizes[d] != b.sizes[d] || (a.sizes[d] > 1 && a.strides[d] != b.strides[d])) return false;
  }
  return true;
}
}  // namespace

void require_no_overlap(Arg a, Arg b) {
  if (a.t == nullptr || b.t == nullptr) return;
  Span const x = byte_span(*a.t), y = byte_span(*b.t);
  if (x.lo < y.hi && y.lo < x.hi) {
    fail(CODA_ERROR_ALIASING, a.name, " and ", b.name, " overlap in memory; this op needs them disjoint");
  }
}

void require_same_or_disjoint(Arg a, Arg b) {
  if (a.t == nullptr || b.t == nullptr) return;
  if (same_view(*a.t, *b.t)) return;
  Span const x = byte_span(*a.t), y = byte_span(*b.t);
  if (x.lo < y.hi && y.lo < x.hi) {
    fail(CODA_ERROR_ALIASING, a.name, " and ", b.name,
         " partially overlap; they may be the very same tensor (in place) or disjoint, nothing in between");
  }
}

void require_kernel_device(int device, std::initializer_list<Arg> args) {
  runtime::DeviceInfo const& info = runtime::current_device_info();  // throws CODA_ERROR_ARCH without a GPU
  if (device >= 0 && device != info.ordinal) {
    fail(CODA_ERROR_DEVICE, "tensors are on CUDA device ", device, " but the current device is ", info.ordinal,
         "; call cudaSetDevice(", device, ") (torch.cuda.device) first");
  }
  if (!(info.major == 9 && info.minor == 0)) {
    fail(CODA_ERROR_ARCH, "CUDA device ", info.ordinal, " (", info.name, ") has compute capability ", info.major, ".",
         info.minor, "; CODA kernels need sm_90 (H100/H200)");
  }
  for (Arg const& a : args) {
    if (a.t == nullptr || a.t->data == nullptr) continue;
    cudaPointerAttributes attr{};
    cudaError_t const err = cudaPointerGetAttributes(&attr, a.t->data);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      fail(CODA_ERROR_DEVICE, a.name, ": data pointer is not known to CUDA (", cudaGetErrorName(err), ")");
    }
    bool const on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
    if (!on_device) {
      fail(CODA_ERROR_DEVICE, a.name, ": data pointer is host memory, but the descriptor says CUDA device ",
           a.t->device);
    }
    if (attr.type == cudaMemoryTypeDevice && attr.device != info.ordinal) {
      fail(CODA_ERROR_DEVICE, a.name, ": memory belongs to CUDA device ", attr.device, ", not the current device ",
           info.ordinal);
    }
  }
}

void require_workspace(char const* op, void const* workspace, size_t bytes, size_t needed) {
  if (needed == 0) return;
  if (workspace == nullptr || bytes < needed) {
    fail(CODA_ERROR_WORKSPACE, "workspace: ", op, " needs ", needed, " bytes (", op, "_workspace_size), got ",
         workspace == nullptr ? 0 : bytes, (workspace == nullptr ? " (NULL)" : ""));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    fail(CODA_ERROR_WORKSPACE, "workspace: pointer must be 256-byte aligned (cudaMalloc gives this)");
  }
}

void not_implemented(char const* op, char const* where) {
  fail(CODA_ERROR_NOT_IMPLEMENTED, op, ": arguments are valid, but the kernel is not in this build yet (", where,
       ")");
}

}  // namespace coda::api
