// TMA stores issued by one lane. CUTLASS 4.2's sm90 TMA epilogue calls its store copy from every thread of warp 0
// (`issue_tma_store = thread_idx / NumThreadsPerWarp == 0`), and the compiled PTX issues a cp.async.bulk.tensor per
// thread: measured on the H200 with SM90_TMA_REDUCE_ADD in the store slot, every element was added ~32 times (errors
// ~31x the product at K = 8, 2056 and 8200; bench/results/vs_quack/lm_head_exp_default). For a plain store the
// copies cost nothing measurable: a one-lane SM90_TMA_STORE in pp_128x192x64_c2x1_d6 left L2 write sectors (22.0 M)
// and time unchanged at llama3-8B gate/up (ncu, bench/results/vs_quack/radd_tuner/), so only the reduction needs
// it. OneLaneTmaReduceAdd is SM90_TMA_REDUCE_ADD with the issue predicated on lane 0; the commit and wait of the
// store pipeline stay as they are (the other lanes commit empty bulk groups, and the epilogue's named barrier after
// the wait covers lane 0's).
// CUTLASS-heavy header: kernel translation units only.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

namespace coda::gemm {

namespace detail {
CUTE_HOST_DEVICE bool lane_zero() {
#if defined(__CUDA_ARCH__)
  return (threadIdx.x & 31u) == 0u;
#else
  return true;
#endif
}
}  // namespace detail

/// SM90_TMA_REDUCE_ADD issued by lane 0 of the calling warp (D += the tile, added once).
struct OneLaneTmaReduceAdd : cute::SM90_TMA_REDUCE_ADD {
  template <class... Coords>
  CUTE_HOST_DEVICE static void copy(void const* desc, void const* smem, Coords const&... coords) {
    if (detail::lane_zero()) cute::SM90_TMA_REDUCE_ADD::copy(desc, smem, coords...);
  }
};

}  // namespace coda::gemm

namespace cute {

/// The executable form of the one-lane op: what make_tma_copy builds ({descriptor, aux params}) and the epilogue's
/// copy() unpacks into Op::copy(descriptor, smem pointer, coordinates...).
template <class Op, class NumBitsPerTMA, class AuxParams_>
struct OneLaneTmaTraits {
  using ThrID = Layout<_1>;
  using SrcLayout = Layout<Shape<_1, NumBitsPerTMA>>;
  using DstLayout = Layout<Shape<_1, NumBitsPerTMA>>;
  using RefLayout = SrcLayout;
  using AuxParams = AuxParams_;

  TmaDescriptor tma_desc_;
  AuxParams aux_params_;

  CUTE_HOST_DEVICE constexpr TmaDescriptor const* get_tma_descriptor() const { return &tma_desc_; }

  template <class GShape>
  CUTE_HOST_DEVICE constexpr auto get_tma_tensor(GShape const& g_shape) const {
    static_assert(is_congruent<decltype(g_shape), decltype(aux_params_.g_stride_)>::value);
    return make_coord_tensor(make_layout(g_shape, aux_params_.g_stride_));
  }

  template <class Coord, int... Is>
  CUTE_HOST_DEVICE void issue(void const* smem, Coord const& coord, seq<Is...>) const {
    Op::copy(&tma_desc_, smem, get<Is>(coord)...);
  }
};

template <class NumBitsPerTMA, class AuxParams_>
struct Copy_Traits<coda::gemm::OneLaneTmaReduceAdd, NumBitsPerTMA, AuxParams_>
    : OneLaneTmaTraits<coda::gemm::OneLaneTmaReduceAdd, NumBitsPerTMA, AuxParams_> {
  template <class TS, class SLayout, class TD, class DLayout>
  CUTE_HOST_DEVICE friend constexpr void copy_unpack(Copy_Traits const& traits, Tensor<TS, SLayout> const& src,
                                                     Tensor<TD, DLayout>& dst) {
    static_assert(is_smem<TS>::value, "OneLaneTmaReduceAdd: the source must be shared memory");
    traits.issue(raw_pointer_cast(src.data()), dst.data().coord_, tuple_seq<decltype(dst.data().coord_)>{});
  }
};

}  // namespace cute
