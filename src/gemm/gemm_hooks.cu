// Host-only translation unit: the extern "C" test/benchmark hooks of src/gemm/gemm_hooks.h.
#include "gemm/gemm_hooks.h"

#include "common/error.hpp"
#include "gemm/gemm.hpp"

#include <exception>
#include <string>
#include <vector>

namespace {

thread_local std::string t_hook_error;

coda::gemm::GemmArgs to_args(coda_gemm_problem const& p) {
  coda::gemm::GemmArgs a;
  a.M = p.M;
  a.N = p.N;
  a.K = p.K;
  a.dtype_ab = p.dtype_ab;
  a.dtype_d = p.dtype_d;
  a.A = p.A;
  a.lda = p.lda;
  a.a_col_major = p.a_col_major != 0;
  a.B = p.B;
  a.ldb = p.ldb;
  a.b_col_major = p.b_col_major != 0;
  a.D = p.D;
  a.ldd = p.ldd;
  a.alpha = p.alpha;
  a.accumulate = p.accumulate != 0;
  return a;
}

template <class F>
coda_status guarded(F&& f) {
  try {
    f();
    t_hook_error.clear();
    return CODA_SUCCESS;
  } catch (coda::detail::Error const& e) {
    t_hook_error = e.what();
    return e.status();
  } catch (std::exception const& e) {
    t_hook_error = e.what();
    return CODA_ERROR_INTERNAL;
  } catch (...) {
    t_hook_error = "unknown exception";
    return CODA_ERROR_INTERNAL;
  }
}

}  // namespace

extern "C" {

int coda_gemm_config_count(void) { return static_cast<int>(coda::gemm::candidate_configs().size()); }

const char* coda_gemm_config_name(int index) {
  auto const& names = coda::gemm::candidate_configs();
  if (index < 0 || index >= static_cast<int>(names.size())) return nullptr;
  return names[static_cast<size_t>(index)].c_str();
}

int coda_gemm_candidate_check(const char* candidate, const coda_gemm_problem* problem) {
  int ok = 0;
  coda_status const s = guarded([&] {
    if (candidate == nullptr || problem == nullptr) {
      coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "candidate and problem must not be NULL");
    }
    std::string const why = coda::gemm::check_candidate(candidate, to_args(*problem));
    if (!why.empty()) coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, why);
    ok = 1;
  });
  return s == CODA_SUCCESS ? ok : 0;
}

size_t coda_gemm_candidate_workspace_size(const char* candidate, const coda_gemm_problem* problem) {
  size_t bytes = 0;
  (void)guarded([&] {
    if (problem == nullptr) coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "problem must not be NULL");
    coda::gemm::GemmArgs const a = to_args(*problem);
    bytes = candidate == nullptr ? coda::gemm::workspace_size(a) : coda::gemm::candidate_workspace_size(candidate, a);
  });
  return bytes;
}

coda_status coda_gemm_run_candidate(const char* candidate, const coda_gemm_problem* problem, void* workspace,
                                    size_t workspace_bytes, void* stream) {
  return guarded([&] {
    if (problem == nullptr) coda::detail::fail(CODA_ERROR_INVALID_ARGUMENT, "problem must not be NULL");
    coda::gemm::GemmArgs const a = to_args(*problem);
    auto const s = static_cast<cudaStream_t>(stream);
    if (candidate == nullptr) {
      coda::gemm::run(a, workspace, workspace_bytes, s);
    } else {
      coda::gemm::run_candidate(candidate, a, workspace, workspace_bytes, s);
    }
  });
}

const char* coda_gemm_last_choice(void) { return coda::gemm::last_choice().c_str(); }

void coda_gemm_clear_tuning(void) { coda::gemm::clear_tuning(); }

const char* coda_gemm_hook_error(void) { return t_hook_error.c_str(); }

int coda_gemm_pdl_compiled(void) {
#ifdef CODA_GDC
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
