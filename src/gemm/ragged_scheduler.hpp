// RaggedPersistentScheduler: CUTLASS's sm90 static persistent tile scheduler without swizzle padding (CUTLASS-heavy:
// include only from kernel translation units, through configs.hpp).
//
// CUTLASS's PersistentTileSchedulerSm90 groups tiles into bands of `swizzle` clusters along the minor (raster)
// mode, and to keep that mapping a pair of shifts it rounds BOTH tile counts up to a multiple of swizzle x cluster.
// The padded tiles are real work items: their loads are out of bounds (zeros) but their MMAs run. At llama3-1B
// gate/up with a 128x192 tile (64 x 86 tiles) swizzle 4 or 8 adds 128 of them (+2.3 %); smaller swizzles avoid the
// padding but lose the L2 reuse of the bands (swizzle 2 along N re-reads the 64 MB weight once per band).
// This scheduler enumerates exactly the tiles of the problem (rounded to whole clusters only): the full bands map as
// CUTLASS maps them, and the remainder forms one narrower last band. Everything else (persistent grid, the order of
// the full bands, the per-CTA stride through the work list, cluster offsets) is CUTLASS's.
#pragma once

#include <cutlass/fast_math.h>
#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include <cute/tensor.hpp>

#include <cstdint>

namespace coda::gemm {

/// The tag a Mainloop config names as its Scheduler (configs.hpp); TileSchedulerSelector maps it below.
struct RaggedPersistentScheduler {};

class RaggedPersistentSchedulerSm90 {
  using Cutlass = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  using WorkTileInfo = Cutlass::WorkTileInfo;
  using Arguments = Cutlass::Arguments;
  using RasterOrder = Cutlass::RasterOrder;
  using RasterOrderOptions = Cutlass::RasterOrderOptions;
  static constexpr bool IsDynamicPersistent = false;
  using Pipeline = cutlass::PipelineEmpty;
  using PipelineStorage = typename Pipeline::SharedStorage;
  using ThrottlePipeline = cutlass::PipelineEmpty;
  using ThrottlePipelineStorage = typename ThrottlePipeline::SharedStorage;
  struct CLCResponse {};
  class SharedStorage {
   public:
    CUTLASS_DEVICE PipelineStorage pipeline() { return PipelineStorage{}; }
    CUTLASS_DEVICE ThrottlePipelineStorage throttle_pipeline() { return ThrottlePipelineStorage{}; }
    CUTLASS_DEVICE CLCResponse* data() { return nullptr; }
  };

  /// CUTLASS's parameters (the kernel reads log_swizzle_size_ and raster_order_ from them), with blocks_per_problem_,
  /// divmod_batch_ and divmod_cluster_blk_major_ over the unpadded tiles, plus the last band's geometry.
  struct Params : cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params {
    uint64_t full_band_clusters_ = 0;        ///< clusters in the full bands (they come first in the work list)
    uint32_t full_band_minor_ = 0;           ///< minor cluster index where the last band starts
    cutlass::FastDivmodU64 divmod_tail_{};   ///< the last band's width in clusters (1 when there is none)
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem_shape_mnkl, TileShape tile_shape,
                                        ClusterShape cluster_shape, cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* /*workspace*/ = nullptr,
                                        uint32_t const /*epilogue_subtile*/ = 1,
                                        uint32_t /*ktile_start_alignment_count*/ = 1u) {
    static_assert(cute::is_static<TileShape>::value && cute::is_static<ClusterShape>::value);
    dim3 const blocks = Cutlass::get_tiled_cta_shape_mnl(problem_shape_mnkl, tile_shape, cluster_shape);
    auto const cluster = cutlass::gemm::to_gemm_coord(cluster_shape);
    Params p;
    p.initialize(blocks, cluster, hw_info, arguments.max_swizzle_size, arguments.raster_order);  // pads; undone here
    bool const along_n = p.raster_order_ == RasterOrder::AlongN;
    // blocks.x / blocks.y are already whole clusters (get_tiled_cta_shape_mnl rounds them).
    uint64_t const clusters_m = blocks.x / cluster.m(), clusters_n = blocks.y / cluster.n();
    uint64_t const clusters_major = along_n ? clusters_n : clusters_m;
    uint64_t const clusters_minor = along_n ? clusters_m : clusters_n;
    uint64_t const swizzle = uint64_t{1} << p.log_swizzle_size_;
    p.blocks_per_problem_ = uint64_t{blocks.x} * blocks.y * blocks.z;
    p.divmod_batch_ = cutlass::FastDivmodU64(uint64_t{blocks.x} * blocks.y);
    p.divmod_cluster_blk_major_ = cutlass::FastDivmodU64(clusters_major);
    uint64_t const full_minor = clusters_minor / swizzle * swizzle;
    uint64_t const tail = clusters_minor - full_minor;
    p.full_band_clusters_ = full_minor * clusters_major;
    p.full_band_minor_ = static_cast<uint32_t>(full_minor);
    p.divmod_tail_ = cutlass::FastDivmodU64(tail == 0 ? 1 : tail);
    return p;
  }

  CUTLASS_HOST_DEVICE static bool can_implement(Arguments const& args) { return args.max_swizzle_size >= 0; }

  template <class ProblemShapeMNK, class BlockShape, class ClusterShape>
  CUTLASS_HOST_DEVICE static dim3 get_grid_shape(Params const& params, ProblemShapeMNK problem_shape_mnk,
                                                 BlockShape cta_shape, ClusterShape cluster_shape,
                                                 cutlass::KernelHardwareInfo hw_info, Arguments arguments = Arguments{},
                                                 bool truncate_by_problem_size = true) {
    // CUTLASS's persistent grid (sized by the device; at most the padded tile count, which only adds CTAs that
    // find no work).
    return Cutlass::get_grid_shape(params, problem_shape_mnk, cta_shape, cluster_shape, hw_info, arguments,
                                   truncate_by_problem_size);
  }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape, cutlass::KernelHardwareInfo const&, uint32_t,
                                   const uint32_t = 1, uint32_t = 1) {
    return 0;
  }

  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const&, void*, cudaStream_t, ProblemShape,
                                              cutlass::KernelHardwareInfo const&, uint32_t, const uint32_t = 1,
                                              uint32_t = 1, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE RaggedPersistentSchedulerSm90() {}

  CUTLASS_DEVICE explicit RaggedPersistentSchedulerSm90(Params const& params) : params_(params) {
#if defined(__CUDA_ARCH__)
    // The same starting index and stride as CUTLASS's (the launch grid is CUTLASS's).
    linear_idx_ = params.raster_order_ == RasterOrder::AlongN
                      ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x)
                      : uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    stride_ = uint64_t(gridDim.x) * uint64_t(gridDim.y) * uint64_t(gridDim.z);
#endif
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return work_for(linear_idx_); }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    linear_idx_ += stride_ * uint64_t(advance_count);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo&, uint32_t advance_count = 1) const {
    return !work_for(linear_idx_ + stride_ * uint64_t(advance_count)).is_valid();
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo) {
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work_tile_info, TileSchedulerPipeline&,
                                      TileSchedulerPipelineState) {
    return fetch_next_work(work_tile_info);
  }

  // Whole output tiles only: no split-K / stream-K reduction (the kernel calls these generically).
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&, Params const&) { return true; }
  CUTLASS_HOST_DEVICE static bool compute_epilogue(WorkTileInfo const&) { return true; }
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const&, WorkTileInfo const&, FrgTensorC&, uint32_t, uint32_t) {}
  template <class FrgTensorC>
  CUTLASS_DEVICE void fixup(WorkTileInfo const&, FrgTensorC&, uint32_t, uint32_t) const {}
  CUTLASS_DEVICE static bool continue_current_work(WorkTileInfo&) { return false; }
  template <class ProblemShape, class TileShape>
  CUTLASS_HOST_DEVICE static int get_work_k_tile_count(WorkTileInfo const&, ProblemShape problem_shape,
                                                       TileShape tile_shape) {
    return cute::size(cute::ceil_div(cute::get<2>(problem_shape), cute::get<2>(tile_shape)));
  }
  CUTLASS_HOST_DEVICE static uint32_t get_work_k_tile_start(WorkTileInfo const&) { return 0u; }
  CUTLASS_DEVICE static bool requires_separate_reduction(Params const&) { return false; }
  CUTLASS_DEVICE static bool valid_warpgroup_in_work_tile(WorkTileInfo const&) { return true; }

 private:
  /// linear index -> tile: CUTLASS's decomposition (batch, cluster id, offsets in the cluster), except that the
  /// cluster id counts only real clusters: ids below full_band_clusters_ fill whole bands of `swizzle` minor
  /// clusters (minor fastest, then major, then the next band), the rest fill the last band of width
  /// divmod_tail_ the same way.
  CUTLASS_DEVICE WorkTileInfo work_for(uint64_t linear_idx) const {
    if (linear_idx >= params_.blocks_per_problem_) return WorkTileInfo::invalid_work_tile();
    uint64_t batch = 0, remainder = 0;
    params_.divmod_batch_(batch, remainder, linear_idx);
    uint64_t const cluster_blocks = params_.divmod_cluster_shape_minor_.divide(remainder);
    uint64_t cluster_id = 0, major_offset = 0;
    params_.divmod_cluster_shape_major_(cluster_id, major_offset, cluster_blocks);
    auto [cta_m_in_cluster, cta_n_in_cluster, unused] = cute::block_id_in_cluster();
    (void)unused;
    bool const along_n = params_.raster_order_ == RasterOrder::AlongN;
    uint64_t const minor_offset = along_n ? cta_m_in_cluster : cta_n_in_cluster;

    uint64_t cluster_minor = 0, cluster_major = 0;
    if (cluster_id < params_.full_band_clusters_) {
      uint64_t const swizzle_mask = (uint64_t{1} << params_.log_swizzle_size_) - 1;
      uint64_t band = 0;
      params_.divmod_cluster_blk_major_(band, cluster_major, cluster_id >> params_.log_swizzle_size_);
      cluster_minor = (band << params_.log_swizzle_size_) + (cluster_id & swizzle_mask);
    } else {
      uint64_t in_tail = 0;
      params_.divmod_tail_(cluster_major, in_tail, cluster_id - params_.full_band_clusters_);
      cluster_minor = params_.full_band_minor_ + in_tail;
    }
    auto const minor = static_cast<int32_t>(cluster_minor * params_.divmod_cluster_shape_minor_.divisor + minor_offset);
    auto const major = static_cast<int32_t>(cluster_major * params_.divmod_cluster_shape_major_.divisor + major_offset);
    return along_n ? WorkTileInfo{minor, major, static_cast<int32_t>(batch), true}
                   : WorkTileInfo{major, minor, static_cast<int32_t>(batch), true};
  }

  Params params_;
  uint64_t linear_idx_ = 0;
  uint64_t stride_ = 0;
};

}  // namespace coda::gemm

namespace cutlass::gemm::kernel::detail {

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<coda::gemm::RaggedPersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = coda::gemm::RaggedPersistentSchedulerSm90;
};

}  // namespace cutlass::gemm::kernel::detail
