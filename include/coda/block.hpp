// CODA C++ block API: thin inline wrappers over include/coda/block.h (same semantics, shapes and rules; errors
// throw coda::Error). A framework keeps one BlockSaved per block between forward and backward.
#ifndef CODA_BLOCK_HPP_
#define CODA_BLOCK_HPP_

#include <coda/block.h>
#include <coda/ops.hpp>

namespace coda {

using BlockConfig = coda_block_config;
using BlockWeights = coda_block_weights;
using BlockGrads = coda_block_grads;
using BlockSaved = coda_block_saved;

/// A block struct (BlockConfig, BlockWeights, BlockGrads, BlockSaved) with struct_size set and every other field
/// zero (block.h "Versioning"): C++'s form of the CODA_BLOCK_*_INIT initialisers, e.g.
/// `auto w = coda::block_struct<coda::BlockWeights>(); w.w_o = ...;`.
template <class T>
inline T block_struct() {
  T t{};
  t.struct_size = sizeof(T);
  return t;
}

inline size_t block_forward_workspace_size(BlockConfig const& config, int64_t M) {
  return coda_block_forward_workspace_size(&config, M);
}
inline size_t block_backward_workspace_size(BlockConfig const& config, int64_t M) {
  return coda_block_backward_workspace_size(&config, M);
}

/// Forward of one block (block.h coda_block_forward): fills `saved` (x2 and qkv are the outputs).
inline void block_forward(BlockConfig const& config, BlockWeights const& weights, TensorView const& y0,
                          TensorView const& x0, TensorView const& positions, TensorView const& inv_freq,
                          BlockSaved& saved, Workspace ws, cudaStream_t stream) {
  check(coda_block_forward(&config, &weights, &y0, &x0, &positions, &inv_freq, &saved, ws.ptr, ws.bytes, stream));
}

/// Backward of one block (block.h coda_block_backward). `dx2` may be nullptr (zero incoming residual gradient);
/// dqkv and saved.z1 are overwritten.
inline void block_backward(BlockConfig const& config, BlockWeights const& weights, TensorView const& y0,
                           TensorView const& positions, TensorView const& inv_freq, BlockSaved const& saved,
                           TensorView& dqkv, TensorView const* dx2, TensorView& dy0_out, TensorView& dx0_out,
                           BlockGrads& grads, Workspace ws, cudaStream_t stream) {
  check(coda_block_backward(&config, &weights, &y0, &positions, &inv_freq, &saved, &dqkv, dx2, &dy0_out, &dx0_out,
                            &grads, ws.ptr, ws.bytes, stream));
}

}  // namespace coda

#endif  // CODA_BLOCK_HPP_
