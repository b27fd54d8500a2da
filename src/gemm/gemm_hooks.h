/*
 * Test and benchmark hooks of the plain GEMM (exported from libcoda, not part of the public API in include/coda).
 * The GPU tests use them to run every compiled config on every layout; bench_gemm uses them to time the autotuned
 * GEMM, each config, and to report the tuning winner. Candidate names: "cublas" or "<config>[:knob=value,...]"
 * (see src/gemm/gemm.hpp and docs/GEMM.md).
 */
#ifndef CODA_GEMM_HOOKS_H_
#define CODA_GEMM_HOOKS_H_

#include <coda/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One plain-GEMM problem, field for field coda::gemm::GemmArgs: D[M,N] = alpha A B^T (+ D if accumulate).
 *  A(m,k) = A[m*lda + k] (a_col_major = 0) or A[m + k*lda] (1); B(n,k) = B[n*ldb + k] (0) or B[n + k*ldb] (1);
 *  D row-major with row stride ldd. The hooks do not run src/api's validation: pass sane device pointers. */
typedef struct coda_gemm_problem {
  int64_t M, N, K;
  coda_dtype dtype_ab; /**< bf16 | fp16 */
  coda_dtype dtype_d;  /**< bf16 | fp16 | fp32 */
  const void* A;
  int64_t lda;
  int a_col_major;
  const void* B;
  int64_t ldb;
  int b_col_major;
  void* D;
  int64_t ldd;
  float alpha;
  int accumulate;
} coda_gemm_problem;

/** Number of compiled configs plus one ("cublas" is the last). */
CODA_API int coda_gemm_config_count(void);
/** Name of config `index` in [0, coda_gemm_config_count()), NULL otherwise. */
CODA_API const char* coda_gemm_config_name(int index);
/** 1 if `candidate` can run `problem`, else 0 with the reason in coda_gemm_hook_error(). */
CODA_API int coda_gemm_candidate_check(const char* candidate, const coda_gemm_problem* problem);
/** Workspace bytes of `candidate` for `problem`; candidate NULL: coda::gemm::workspace_size (autotuned path). */
CODA_API size_t coda_gemm_candidate_workspace_size(const char* candidate, const coda_gemm_problem* problem);
/** Runs `candidate` (no tuning), or the autotuned path when candidate is NULL (what coda_gemm runs: honours
 *  CODA_GEMM_CONFIG, CODA_GEMM_NO_CUBLAS, ...). On failure the message is in coda_gemm_hook_error(). */
CODA_API coda_status coda_gemm_run_candidate(const char* candidate, const coda_gemm_problem* problem,
                                             void* workspace, size_t workspace_bytes, void* stream);
/** The candidate the last GEMM run on this thread used (autotuned or not; "" before the first). */
CODA_API const char* coda_gemm_last_choice(void);
/** Forgets every autotuning winner of this process. */
CODA_API void coda_gemm_clear_tuning(void);
/** 1 if libcoda was built with -DCODA_GDC=ON (its GEMM kernels can launch with PDL under CODA_PDL=1), else 0. */
CODA_API int coda_gemm_pdl_compiled(void);
/** Message of the last failed hook call on this thread ("" if none). */
CODA_API const char* coda_gemm_hook_error(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // CODA_GEMM_HOOKS_H_
