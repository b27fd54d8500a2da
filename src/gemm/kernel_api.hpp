// The CUTLASS-free interface of one compiled GEMM kernel: what a dispatcher, the autotuner and the tests see.
//
// Each kernel instantiation lives in its own generated .cu (CUTLASS headers only there; src/ops/registry.cmake) and
// is reached through a `KernelOps<EpilogueArgs>` table of plain function pointers returned by a getter declared in
// a generated CUTLASS-free header (gemm/plain_instances.hpp for the plain GEMM, ops/<op>/instances.hpp for a fused
// op, each with its own EpilogueArgs). This keeps host code that dispatches, tunes or tests cheap to compile.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace coda::gemm {

/// Whether CODA's GEMM kernels (plain and fused) launch with programmatic dependent launch (PDL): true when
/// CODA_PDL is set to anything but "", "0", "false", "off" or "no"; read on every launch. With it a kernel's CTAs may
/// start while the previous kernel in the stream finishes its last tiles (quack launches its sm90 GEMMs this way).
/// Takes effect only in a build with -DCODA_GDC=ON, whose kernels are compiled with CUTLASS_ENABLE_GDC_FOR_SM90: their
/// producer warps wait for the previous grid (griddepcontrol.wait) before their first global load, and every
/// epilogue read or write comes after that. The stream-K kernels never launch early (CUTLASS 4.2 does not compile
/// the hooks there). Off by default, in the build and at run time, until measured on the H200.
bool programmatic_launch();

/// Order in which the persistent tile scheduler walks output tiles (CUTLASS `RasterOrderOptions`).
/// kHeuristic: along M when the grid has more N tiles than M tiles, else along N.
enum class Raster : uint8_t { kHeuristic, kAlongM, kAlongN };

/// How the stream-K scheduler splits the work (CUTLASS `DecompositionMode`). Only for stream-K kernels; persistent
/// (data-parallel) kernels accept kHeuristic and kDataParallel, which mean the same for them.
enum class Decomposition : uint8_t { kHeuristic, kDataParallel, kSplitK, kStreamK };

/// Run-time scheduler knobs: they change the schedule, never the result of a data-parallel kernel. (Stream-K and
/// split-K change the fp32 summation order across K, so results may differ by rounding between knob settings;
/// each setting is deterministic: partials are reduced in a fixed order.)
struct Knobs {
  Raster raster = Raster::kHeuristic;
  int swizzle = 1;  ///< max_swizzle_size: 1, 2, 4 or 8 (tiles grouped along the raster direction)
  Decomposition decomposition = Decomposition::kHeuristic;
  int splits = 1;  ///< split-K factor for Decomposition::kSplitK (>= 1)
};

/// Operand pointers and extents of one GEMM launch: D[M,N] = epilogue(A[M,K] B[N,K]^T, C[M,N]).
/// Which of A/B is K-major is fixed by the kernel's layouts; lda/ldb are the strides of the non-unit dimension.
/// C and D are row-major with row strides ldc/ldd. C may be nullptr when the epilogue does not read it.
struct Operands {
  int64_t M = 0, N = 0, K = 0;
  void const* A = nullptr;
  int64_t lda = 0;
  void const* B = nullptr;
  int64_t ldb = 0;
  void const* C = nullptr;
  int64_t ldc = 0;
  void* D = nullptr;
  int64_t ldd = 0;
};

/// Static description of a kernel's mainloop config (for tuning heuristics, listings and reports).
struct KernelInfo {
  char const* config = "";  ///< config name, e.g. "coop_128x256x64_c2x1"
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int cluster_m = 1, cluster_n = 1;
  bool pingpong = false;  ///< pingpong (two consumer warpgroups on alternating tiles) vs cooperative
  bool stream_k = false;  ///< stream-K tile scheduler (accepts every Decomposition)
  bool ragged = false;    ///< the ragged tile scheduler (ragged_scheduler.hpp): no tiles padded to the swizzle
};

/// Function table of one compiled kernel, parameterised by the epilogue's (CUTLASS-free) argument struct.
template <class EpilogueArgs>
struct KernelOps {
  KernelInfo info;
  /// "" when the kernel can run this problem with these knobs, else the reason (names the rule that fails).
  std::string (*check)(Operands const&, EpilogueArgs const&, Knobs const&) = nullptr;
  /// Bytes of device workspace `run` needs (stream-K partials, epilogue reductions); 0 for most problems.
  size_t (*workspace_size)(Operands const&, EpilogueArgs const&, Knobs const&) = nullptr;
  /// Enqueues the kernel (and any workspace initialisation) on `stream`. Throws coda::detail::Error.
  void (*run)(Operands const&, EpilogueArgs const&, Knobs const&, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) = nullptr;
};

/// Multiprocessor count of a CUDA device (queried once per device, then cached). Throws on a CUDA error.
int device_sm_count(int device);

}  // namespace coda::gemm
