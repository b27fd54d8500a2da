// coda_linear_cross_entropy dispatch: chunked linear_rowscale_lse (no logits) + the loss from row statistics.
#include "ops/linear_cross_entropy/linear_cross_entropy.hpp"

#include "common/error.hpp"
#include "kernels/kernels.hpp"
#include "ops/linear_rowscale_lse/kernels.hpp"

#include <algorithm>

namespace coda::ops {

namespace {

size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t chunk_of(int64_t M, int64_t chunk_rows) {
  int64_t const c = chunk_rows > 0 ? chunk_rows : kDefaultChunkRows;
  return std::max<int64_t>(1, std::min(c, M));
}

struct Layout {
  size_t partials = 0, row = 0, ce = 0;
  size_t total() const { return partials + 3 * row + ce; }
};

Layout layout_of(int64_t M, int64_t V, int64_t chunk_rows) {
  Layout l;
  if (M <= 0 || V <= 0) return l;
  l.partials = lse_workspace(chunk_of(M, chunk_rows), V, kLseTileM, kLseTileN).bytes();
  l.row = round256(static_cast<size_t>(M) * sizeof(float));
  l.ce = kernels::cross_entropy_workspace_size(M);
  return l;
}

}  // namespace

size_t linear_cross_entropy_workspace_bytes(int64_t M, int64_t V, int64_t chunk_rows) {
  return layout_of(M, V, chunk_rows).total();
}

void linear_cross_entropy(LinearCrossEntropyArgs const& a, cudaStream_t stream) {
  if (a.M <= 0) return;
  Layout const l = layout_of(a.M, a.V, a.chunk_rows);
  if (a.workspace == nullptr || a.workspace_bytes < l.total()) {
    coda::detail::fail(CODA_ERROR_WORKSPACE, "coda_linear_cross_entropy: needs ", l.total(),
                       " bytes of workspace, got ", a.workspace_bytes);
  }
  char* const base = static_cast<char*>(a.workspace);
  void* const partials = base;
  auto* const lse_ws = reinterpret_cast<float*>(base + l.partials);
  auto* const target_logit = reinterpret_cast<float*>(base + l.partials + l.row);
  auto* const logit_sum = reinterpret_cast<float*>(base + l.partials + 2 * l.row);
  void* const ce_ws = base + l.partials + 3 * l.row;
  float* const lse = a.lse != nullptr ? a.lse : lse_ws;
  bool const need_sum = a.options.label_smoothing > 0.0f;
  size_t const target_bytes = a.targets_int64 ? 8 : 4;

  int64_t const chunk = chunk_of(a.M, a.chunk_rows);
  for (int64_t r0 = 0; r0 < a.M; r0 += chunk) {
    int64_t const rows = std::min(chunk, a.M - r0);
    linear_rowscale_lse(rows, a.V, a.K, static_cast<char const*>(a.h) + r0 * a.ldh * 2, a.ldh, a.w, a.ldw,
                        a.rstd + r0, static_cast<char const*>(a.targets) + r0 * target_bytes, a.targets_int64,
                        a.options.softcap, a.options.ignore_index, lse + r0, target_logit + r0, /*logits=*/nullptr,
                        0, partials, l.partials, a.fp16, stream, need_sum ? logit_sum + r0 : nullptr);
  }

  kernels::CrossEntropyStatsArgs c;
  c.M = a.M;
  c.V = a.V;
  c.lse = lse;
  c.target_logit = target_logit;
  c.logit_sum = logit_sum;
  c.targets = a.targets;
  c.targets_int64 = a.targets_int64;
  c.options = a.options;
  c.loss = a.loss;
  c.workspace = ce_ws;
  kernels::cross_entropy_from_stats(c, stream);
}

}  // namespace coda::ops
