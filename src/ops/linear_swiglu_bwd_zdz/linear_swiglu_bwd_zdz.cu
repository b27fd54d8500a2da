// linear_swiglu_bwd_zdz (host only, no CUTLASS): the C ABI entry point (validation), and the dispatch: the fused
// dgrad GEMM (y as D, dz and the zdz row partials from the node), then the zdz finishing reduce.
#include "ops/linear_swiglu_bwd_zdz/instances.hpp"

#include <coda/coda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "api/checks.hpp"
#include "api/guard.hpp"
#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/op_config.hpp"

namespace coda::ops {

void linear_swiglu_bwd_zdz(int64_t M, int64_t F, int64_t d, void const* dx, int64_t ldx, void const* w_down,
                           int64_t ldw, void const* z, int64_t ldz, void* dz, int64_t lddz, void* y, int64_t ldy,
                           float* zdz, bool fp16, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  namespace kn = swiglu_bwd_kernels;
  // bf16: pingpong 128x128 (64x32 subtiles) or 128x192 with 64x16 subtiles (the node's live set beside 192
  // accumulators); fp16: 128x128.
  auto const choice = kn::choose(fp16, M, F, d);  // op.cmake: the tile policy
  gemm::KernelOps<SwigluBwdArgs> const& k = *choice.ops;

  // Workspace: row partials [T, Mpad] fp32, T = ceil(F / CTA_N), Mpad = round_up(M, CTA_M).
  int64_t const tiles = (F + k.info.tile_n - 1) / k.info.tile_n;
  int64_t const m_pad = (M + k.info.tile_m - 1) / k.info.tile_m * k.info.tile_m;
  size_t const need = static_cast<size_t>(tiles * m_pad) * sizeof(float);
  if (workspace_bytes < need || workspace == nullptr || (reinterpret_cast<uintptr_t>(workspace) & 15u) != 0) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_swiglu_bwd_zdz: kernel ", k.info.config, " needs ", need,
                       " bytes of 16-byte aligned workspace for the zdz partials, got ", workspace_bytes);
  }

  gemm::Operands op;
  op.M = M, op.N = F, op.K = d;
  op.A = dx, op.lda = ldx;
  op.B = w_down, op.ldb = ldw;
  op.D = y, op.ldd = ldy;
  // z as C: [M, F] 32-bit words, one (g, u) pair per accumulator element (the epilogue program's header). The C
  // API checks z (TMA-aligned, row stride % 8); this layer repeats what the word view needs, since an odd ldz
  // would silently become a shorter word stride.
  if (z == nullptr || (M > 1 && ldz % 8 != 0)) {
    coda::detail::fail(CODA_ERROR_MISALIGNED, "coda_linear_swiglu_bwd_zdz: z must be non-null with a row stride that is a",
                       " multiple of 8 elements (read as 32-bit words through TMA), got ldz=", ldz);
  }
  op.C = z, op.ldc = ldz / 2;
  SwigluBwdArgs args;
  args.dz = dz;
  args.lddz = lddz;
  args.zdz_partials = static_cast<float*>(workspace);
  // No CUTLASS workspace: the node writes the caller's buffers; run() rejects a kernel that would need one.
  k.run(op, args, choice.knobs, nullptr, 0, stream);
  // zdz[m] = (1/d) sum_t partials[t, m]: the partials are [T, Mpad] m-major, i.e. "columns" m of a [T, Mpad] matrix.
  kernels::column_sum(args.zdz_partials, tiles, m_pad, M, zdz, stream, 1.0 / static_cast<double>(d));
}

}  // namespace coda::ops

// The C ABI entry point (coda.h): every argument validated, then the dispatch above.
namespace api = coda::api;
using coda::api::Arg;
using coda::api::guarded;
using coda::api::row_stride;
using coda::detail::fail;

extern "C" {

CODA_API size_t coda_linear_swiglu_bwd_zdz_workspace_size(int64_t M, int64_t N) {
  return api::row_partials_bytes(M, N);
}

CODA_API coda_status coda_linear_swiglu_bwd_zdz(const coda_tensor* dx, const coda_tensor* w_down,
                                                const coda_tensor* z, coda_tensor* dz_out, coda_tensor* y_out,
                                                coda_tensor* zdz_out, void* workspace, size_t workspace_bytes,
                                                void* stream) {
  return guarded("coda_linear_swiglu_bwd_zdz", [&] {
    Arg const DX{dx, "dx"}, W{w_down, "w_down"}, Z{z, "z"}, DZ{dz_out, "dz_out"}, Y{y_out, "y_out"};
    Arg const ZD{zdz_out, "zdz_out"};
    api::LinearShape const s = api::check_dgrad(DX, W);  // N = F
    if (s.N % 8 != 0) {
      fail(CODA_ERROR_SHAPE, "w_down: sizes[1] (F) must be a multiple of 8 (16-byte rows of y), got ", s.N);
    }
    api::check_activation(Z, DX, s.M, 2 * s.N, "M", "2F = 2 * w_down.sizes[1]");
    api::check_activation(DZ, DX, s.M, 2 * s.N, "M", "2F");
    api::check_activation(Y, DX, s.M, s.N, "M", "F = w_down.sizes[1]");
    api::check_vector(ZD, s.M, {CODA_FP32}, "M", "dx.sizes[0]");
    api::require_same_or_disjoint(DZ, Z);  // dz may overwrite the saved z in place
    api::check_disjoint({DZ}, {DX, W});
    api::check_disjoint({Y, ZD}, {DX, W, Z, DZ});
    api::require_workspace("coda_linear_swiglu_bwd_zdz", workspace, workspace_bytes,
                           coda_linear_swiglu_bwd_zdz_workspace_size(s.M, s.N));
    api::require_fused_launch({DX, W, Z, DZ, Y, ZD});
    if (s.M == 0) return;  // nothing to compute (zdz, dz and y are empty)
    coda::ops::linear_swiglu_bwd_zdz(s.M, s.N, s.K, dx->data, row_stride(DX, s.K), w_down->data, row_stride(W, s.N),
                                     z->data, row_stride(Z, 2 * s.N), dz_out->data, row_stride(DZ, 2 * s.N),
                                     y_out->data, row_stride(Y, s.N), static_cast<float*>(zdz_out->data),
                                     DX.dtype() == CODA_FP16, workspace, workspace_bytes,
                                     static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
