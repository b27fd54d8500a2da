// Sm90PrepassCollective<Base, Prepass>: an sm90 TMA collective epilogue (Base, the CUTLASS builder's) that first
// runs Prepass::run over the consumer's whole accumulator tile, then Base::store's subtile loop. CUTLASS-heavy:
// include only from epilogue programs.
//
// Why: the EVT callbacks see one epilogue subtile at a time (64 x 32 elements at the builder's choice), so a statistic
// over a wider span of a row (a head's mean square, 64 or 128 columns) needs either a subtile as wide as the span,
// whose fragment doubles the epilogue's live registers (linear_rowscale_qk_norm_rope's 64 x 128 `_e128` configs), or a
// pass over the accumulators before the loop. Every accumulator is in the thread's registers when store() begins, and
// each thread later visits only its own accumulators, so a prepass can leave per-row values in shared memory for the
// thread's own rows (its quad's: the four lanes that share a row) and the node reads them back in visit() with no
// barrier beyond the warp's.
//
// Prepass: a struct with
//   template <class Acc, class TiledMma, class TensorStorage>
//   static CUTLASS_DEVICE void run(Acc const& accumulators, TiledMma const&, int thread_idx, TensorStorage&);
// (TensorStorage: the collective's, whose `thread` member holds the fusion tree's SharedStorage.)
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

namespace coda::epilogue {

template <class Base, class Prepass>
struct Sm90PrepassCollective : Base {
  using Base::Base;

  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma>
  CUTLASS_DEVICE auto store(typename Base::LoadPipeline load_pipeline,
                            typename Base::LoadPipelineState load_pipe_consumer_state,
                            typename Base::StorePipeline store_pipeline,
                            typename Base::StorePipelineState store_pipe_producer_state,
                            ProblemShapeMNKL problem_shape_mnkl, TileShapeMNK tile_shape_MNK,
                            TileCoordMNKL tile_coord_mnkl, cute::Tensor<AccEngine, AccLayout> accumulators,
                            TiledMma tiled_mma, int thread_idx, typename Base::TensorStorage& shared_tensors,
                            int subtile_idx = -1) {
    Prepass::run(accumulators, tiled_mma, thread_idx, shared_tensors);
    return Base::store(load_pipeline, load_pipe_consumer_state, store_pipeline, store_pipe_producer_state,
                       problem_shape_mnkl, tile_shape_MNK, tile_coord_mnkl, accumulators, tiled_mma, thread_idx,
                       shared_tensors, subtile_idx);
  }
};

}  // namespace coda::epilogue
