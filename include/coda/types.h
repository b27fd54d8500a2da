/*
 * CODA C ABI types: status codes, dtypes, the tensor descriptor, the cross-entropy options, the export macro.
 * Included by coda.h (the API; read that first). Kept apart so that kernel translation units depend on these
 * stable definitions only, not on the API's declarations and documentation.
 */
#ifndef CODA_TYPES_H_
#define CODA_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CODA_API __declspec(dllexport)
#else
#define CODA_API __attribute__((visibility("default")))
#endif

#define CODA_VERSION_MAJOR 0
#define CODA_VERSION_MINOR 1
#define CODA_VERSION_PATCH 0
#define CODA_MAX_RANK 4

/** Status codes. Values are fixed: they are part of the ABI. */
typedef enum coda_status {
  CODA_SUCCESS = 0,
  CODA_ERROR_INVALID_ARGUMENT = 1, /**< null pointer, bad enum, bad scalar (eps <= 0, ...) */
  CODA_ERROR_DTYPE = 2,            /**< dtype not accepted, or dtypes that must match do not */
  CODA_ERROR_SHAPE = 3,            /**< wrong rank or sizes that do not agree */
  CODA_ERROR_LAYOUT = 4,           /**< strides not supported (non-contiguous where contiguity is required) */
  CODA_ERROR_MISALIGNED = 5,       /**< pointer or leading dimension not 16-byte aligned (TMA) */
  CODA_ERROR_DEVICE = 6,           /**< tensor not on the current CUDA device, or on the host */
  CODA_ERROR_ALIASING = 7,         /**< outputs overlap each other or an input where the op forbids it */
  CODA_ERROR_WORKSPACE = 8,        /**< workspace missing, too small or misaligned */
  CODA_ERROR_ARCH = 9,             /**< no CUDA device, or the device is not sm_90 (Hopper) */
  CODA_ERROR_NOT_IMPLEMENTED = 10, /**< op declared but its kernel does not exist yet in this build */
  CODA_ERROR_CUDA = 11,            /**< a CUDA runtime / cuBLAS call failed (message has the CUDA error) */
  CODA_ERROR_INTERNAL = 12         /**< a CODA bug: please report with the message */
} coda_status;

/** Element types. Values are fixed (ABI). */
typedef enum coda_dtype {
  CODA_BF16 = 0,
  CODA_FP16 = 1,
  CODA_FP32 = 2,
  CODA_INT32 = 3,
  CODA_INT64 = 4
} coda_dtype;

/** Reduction of a per-row loss. Values are fixed (ABI). */
typedef enum coda_reduction {
  CODA_REDUCTION_NONE = 0, /**< loss is [M] */
  CODA_REDUCTION_MEAN = 1, /**< loss is [] : sum over non-ignored rows / number of non-ignored rows (0 if none) */
  CODA_REDUCTION_SUM = 2   /**< loss is [] : sum over rows */
} coda_reduction;

/**
 * A strided tensor. `sizes[i]` and `strides[i]` (in elements, not bytes) for i < rank; entries past rank are
 * ignored. rank 0 is a scalar. `device` is the CUDA device ordinal, or -1 for host memory (never accepted by
 * kernels; the float64 reference functions take host tensors).
 */
typedef struct coda_tensor {
  void* data;
  coda_dtype dtype;
  int32_t rank;
  int64_t sizes[CODA_MAX_RANK];
  int64_t strides[CODA_MAX_RANK];
  int32_t device;
} coda_tensor;

/** Options of the cross-entropy ops. Start from coda_ce_options_default() (PyTorch's defaults); a
 *  zero-initialised struct means reduction none and ignore_index 0. */
typedef struct coda_ce_options {
  int64_t ignore_index;    /**< rows whose target equals this get loss 0 and gradient 0 (any value) */
  coda_reduction reduction;
  float label_smoothing;   /**< eps_ls in [0, 1] */
  float z_loss;            /**< lambda >= 0: adds lambda * lse^2 per row */
  float softcap;           /**< c > 0: logits <- c * tanh(logits / c) before the softmax; 0 = off */
} coda_ce_options;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // CODA_TYPES_H_
