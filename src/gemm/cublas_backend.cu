// Host-only translation unit (no kernels): cuBLAS handles, their workspaces and the cublasGemmEx call of the plain
// GEMM.
#include "gemm/cublas_backend.hpp"

#include "common/error.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace coda::gemm {

namespace {

[[noreturn]] void cublas_fail(cublasStatus_t status, char const* call) {
  coda::detail::fail(CODA_ERROR_CUDA, call, " failed: ", cublasGetStatusName(status), " (",
                     cublasGetStatusString(status), ")");
}

#define CODA_CUBLAS_CHECK(call)                                \
  do {                                                         \
    cublasStatus_t coda_cublas_status_ = (call);               \
    if (coda_cublas_status_ != CUBLAS_STATUS_SUCCESS) {        \
      cublas_fail(coda_cublas_status_, #call);                 \
    }                                                          \
  } while (0)

/// Relaxed stream-capture mode for this thread while in scope: allocations made on the side of a capture (a handle,
/// a workspace) are allowed instead of invalidating it. Restores the caller's mode.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { CODA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(RelaxedCaptureMode const&) = delete;
  RelaxedCaptureMode& operator=(RelaxedCaptureMode const&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

/// Process-wide free list of cuBLAS handles per device. Handles are created lazily, lent to one thread at a time
/// and returned when that thread exits (so short-lived threads do not leak a handle and its workspace each);
/// never destroyed (destroying at process exit may run after the CUDA context is gone).
class HandlePool {
 public:
  static HandlePool& global() {
    static HandlePool* const pool = new HandlePool();
    return *pool;
  }
  cublasHandle_t acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& list = free_[device];
      if (!list.empty()) {
        cublasHandle_t h = list.back();
        list.pop_back();
        return h;
      }
    }
    cublasHandle_t h = nullptr;  // created on the current device, which is `device`
    // cublasCreate allocates device memory, and a thread's first GEMM may come while another thread captures a
    // CUDA graph in global mode, which refuses such calls: relaxed mode, as for the workspace (stream_workspace says
    // what it does not cover; not measured for the handle itself).
    RelaxedCaptureMode relaxed;
    CODA_CUBLAS_CHECK(cublasCreate(&h));
    cublasStatus_t const status = cublasSetMathMode(
        h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (status != CUBLAS_STATUS_SUCCESS) {
      (void)cublasDestroy(h);
      cublas_fail(status, "cublasSetMathMode");
    }
    return h;
  }
  void release(int device, cublasHandle_t h) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(h);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int, std::vector<cublasHandle_t>> free_;
};

/// This thread's handles (one per device), given back to the pool at thread exit.
struct ThreadHandles {
  std::unordered_map<int, cublasHandle_t> by_device;
  ~ThreadHandles() {
    for (auto const& [device, h] : by_device) HandlePool::global().release(device, h);
  }
};

cublasHandle_t thread_handle(int device) {
  thread_local ThreadHandles handles;
  auto it = handles.by_device.find(device);
  if (it != handles.by_device.end()) return it->second;
  cublasHandle_t h = HandlePool::global().acquire(device);
  handles.by_device.emplace(device, h);
  return h;
}

/// The workspace cuBLAS recommends for Hopper (cublasSetWorkspace: 32 MiB; PyTorch gives its handles the same).
/// Without it the handle keeps cuBLAS's smaller default pool and the heuristic skips kernels that need more.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

/// Workspaces per handle, at most: past that a call keeps cuBLAS's default pool (bounded memory when a thread
/// cycles through many streams; PyTorch's stream pool is bounded the same way).
constexpr size_t kMaxWorkspacesPerHandle = 8;

/// The handle's workspace for `stream`, or nullptr (then cuBLAS's default pool serves the call): when the stream
/// has no id, the handle has kMaxWorkspacesPerHandle already, or the allocation fails (the error is cleared, so it
/// is not reported later against an unrelated call).
/// - One per (handle, stream): a handle is one thread's, but that thread may enqueue on several streams, and two
///   GEMMs running at once must not share scratch. Keyed by cudaStreamGetId, which is never reused (a destroyed
///   stream's address can be, while its work still runs).
/// - Allocated on first use in relaxed capture mode, so another thread's global-mode capture does not refuse it. On
///   the capturing stream itself it failed on the H200 all the same (CUDA 13.0: no workspace was set, and cuBLAS's
///   own pool then failed with CUBLAS_STATUS_EXECUTION_FAILED, invalidating the capture; graph_pinned_cublas.log
///   in bench/results/gpu_checks_f51576a/), which is why the plain GEMM never calls cuBLAS in a capture
///   (gemm.cu choose()) unless no CODA kernel exists for the problem.
/// - Never freed (like the handles).
void* stream_workspace(cublasHandle_t h, cudaStream_t stream) {
  unsigned long long id = 0;
  if (cudaStreamGetId(stream, &id) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  thread_local cublasHandle_t last_h = nullptr;  // the common case, one stream: no lock
  thread_local unsigned long long last_id = 0;
  thread_local void* last_ws = nullptr;
  if (last_ws != nullptr && h == last_h && id == last_id) return last_ws;
  static std::mutex mutex;
  static auto* const pool = new std::unordered_map<cublasHandle_t, std::unordered_map<unsigned long long, void*>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& mine = (*pool)[h];
  auto it = mine.find(id);
  void* ws = it != mine.end() ? it->second : nullptr;
  if (ws == nullptr) {
    if (mine.size() >= kMaxWorkspacesPerHandle) return nullptr;
    cudaError_t err;
    {
      RelaxedCaptureMode relaxed;
      err = cudaMalloc(&ws, kWorkspaceBytes);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    mine.emplace(id, ws);
  }
  last_h = h, last_id = id, last_ws = ws;
  return ws;
}

cudaDataType_t cuda_type(coda_dtype t) {
  switch (t) {
    case CODA_BF16: return CUDA_R_16BF;
    case CODA_FP16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

}  // namespace

std::string cublas_check(GemmArgs const& args) {
  bool const ab_ok = args.dtype_ab == CODA_BF16 || args.dtype_ab == CODA_FP16;
  bool const d_ok = args.dtype_d == args.dtype_ab || args.dtype_d == CODA_FP32;
  if (!ab_ok || !d_ok) {
    return coda::detail::concat("cuBLAS takes A/B bf16 or fp16 with D of the same type or fp32; got A/B dtype ",
                                static_cast<int>(args.dtype_ab), ", D dtype ", static_cast<int>(args.dtype_d));
  }
  return {};
}

void cublas_run(GemmArgs const& args, cudaStream_t stream) {
  std::string const why = cublas_check(args);
  if (!why.empty()) coda::detail::fail(CODA_ERROR_DTYPE, why);
  int device = 0;
  CODA_CUDA_CHECK(cudaGetDevice(&device));
  cublasHandle_t const h = thread_handle(device);
  CODA_CUBLAS_CHECK(cublasSetStream(h, stream));
  // cublasSetStream resets the handle's workspace to cuBLAS's default: set ours after it, every call.
  if (void* ws = stream_workspace(h, stream)) CODA_CUBLAS_CHECK(cublasSetWorkspace(h, ws, kWorkspaceBytes));

  // Row-major D[M,N] = A B^T is column-major D^T[N,M] = B' A' with B' the N x K and A' the K x M operand.
  // B K-major (B(n,k) = B[n*ldb + k]) is a column-major K x N matrix: op T. B N-major: column-major N x K: op N.
  // A K-major (A(m,k) = A[m*lda + k]) is a column-major K x M matrix: op N. A M-major: column-major M x K: op T.
  cublasOperation_t const op_b = args.b_col_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  cublasOperation_t const op_a = args.a_col_major ? CUBLAS_OP_T : CUBLAS_OP_N;
  // cuBLAS wants ld >= the stored rows even when the other extent is 1 (then the stride itself is never used).
  int64_t const ldb = std::max<int64_t>({args.ldb, args.b_col_major ? args.N : args.K, 1});
  int64_t const lda = std::max<int64_t>({args.lda, args.a_col_major ? args.M : args.K, 1});
  int64_t const ldd = std::max<int64_t>({args.ldd, args.N, 1});
  float const alpha = args.alpha;
  float const beta = args.accumulate ? 1.0f : 0.0f;
  CODA_CUBLAS_CHECK(cublasGemmEx_64(h, op_b, op_a, args.N, args.M, args.K, &alpha, args.B, cuda_type(args.dtype_ab),
                                    ldb, args.A, cuda_type(args.dtype_ab), lda, &beta, args.D,
                                    cuda_type(args.dtype_d), ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace coda::gemm
