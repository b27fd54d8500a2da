// FusedLinear<Config, Epilogue, ElementAB, ElementD, LayoutA, LayoutB>: one CUTLASS sm90 warp-specialized GEMM
// kernel built from a mainloop config (configs.hpp) and an epilogue program. CUTLASS-heavy: include only from the
// one-kernel-per-file translation units (generated from src/gemm/plain.cmake and src/ops/<op>/op.cmake).
//
// An epilogue program is a struct with
//   using Args = <CUTLASS-free run-time arguments>;           // what the launcher receives
//   template <class Traits> struct Program {                   // Traits: EpilogueTraits<Config, ElementD> below
//     using ElementC = <element of the C source tile, or void>;
//     using Fusion   = <an EVT tree (Sm90EVT<...>) or a cutlass::epilogue::fusion tag>;
//     template <class FusionArguments>
//     static void make_args(FusionArguments& out, Args const&, Operands const&);  // fill the nested EVT args
//   };
// so a fused op writes only its EVT and its argument builder (see linear_combination.hpp), then one .cu per config:
//   KernelOps<MyArgs> const& my_op_coop_128x256() {
//     return FusedLinear<config::Coop128x256x64C2x1, MyEpilogue, cutlass::bfloat16_t, cutlass::bfloat16_t,
//                        cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>::ops();
//   }
//
// Layout tags follow CUTLASS: A is M x K (RowMajor = K-major, ColumnMajor = M-major); B is K x N (ColumnMajor =
// K-major, i.e. the [N,K] nn.Linear weight; RowMajor = N-major). C and D are row-major M x N with a row stride.
#pragma once

// Only sm_90a has the wgmma/TMA/cluster instructions these kernels use; with plain sm_90 CUTLASS silently compiles
// the kernel body to a trap-free no-op (CUTLASS_EVT.md section 8), so refuse any other device target.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "CODA GEMM kernels must be compiled for sm_90a only: -gencode arch=compute_90a,code=sm_90a"
#endif

#include "common/error.hpp"
#include "gemm/configs.hpp"
#include "gemm/kernel_api.hpp"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/gemm.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/layout/matrix.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace coda::gemm {

template <class Traits, class ElementC, int kStagesD>
struct DeepStorePolicyOf;  // defined below EpilogueTraits; detail::DispatchPolicyOf names it first

namespace detail {

/// Elements per 16 bytes (the TMA alignment unit); void (no tensor) counts as 16-bit.
template <class T>
constexpr int alignment16() {
  if constexpr (std::is_void_v<T>) {
    return 8;
  } else {
    return 128 / cutlass::sizeof_bits<T>::value;
  }
}

template <class T>
constexpr int element_bytes() {
  if constexpr (std::is_void_v<T>) {
    return 0;
  } else {
    return cutlass::sizeof_bits<T>::value / 8;
  }
}

/// Per-device cache slots (device ordinals beyond this are served uncached).
inline constexpr int kMaxCachedDevices = 64;

/// A CUTLASS operand/output stride (rank 3: two matrix modes + batch) from a leading dimension. The unit-stride
/// mode is the static one (cute::Int<1>); the other gets `ld`; the batch mode gets `batch`.
template <class T>
using bare_t = std::remove_cv_t<std::remove_reference_t<T>>;  // std::remove_cvref_t is C++20; nvcc builds C++17

template <class Stride>
Stride make_stride_from_ld(int64_t ld, int64_t batch) {
  Stride stride{};
  if constexpr (cute::is_static_v<bare_t<decltype(cute::get<0>(stride))>>) {
    cute::get<1>(stride) = ld;
  } else {
    cute::get<0>(stride) = ld;
  }
  if constexpr (!cute::is_static_v<bare_t<decltype(cute::get<2>(stride))>>) {
    cute::get<2>(stride) = batch;
  }
  return stride;
}

inline bool aligned16(void const* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// The leading dimension handed to TMA: as given, except for a single row, whose stride is never used but must
/// still be a 16-byte multiple in the descriptor (then the contiguous extent rounded up to `align`).
inline int64_t effective_ld(int64_t ld, int64_t rows, int64_t contig, int align) {
  return rows > 1 ? ld : (contig + align - 1) / align * align;
}

/// Whether an epilogue program names its own EpilogueDispatchPolicy.
template <class Program, class = void>
struct HasEpilogueDispatchPolicy : std::false_type {};
template <class Program>
struct HasEpilogueDispatchPolicy<Program, std::void_t<typename Program::EpilogueDispatchPolicy>> : std::true_type {};

/// The D stages of an sm90 TMA epilogue's dispatch policy (every FusedLinear collective has one; the collective's own
/// StagesD is private). Undefined for any other policy, so that the check below cannot pass unread.
template <class Policy>
struct PolicyStagesD;
template <int kStagesC, int kStagesD, int kFragmentSize, bool kReuseSmemC, bool kDelayTmaStore>
struct PolicyStagesD<
    cutlass::epilogue::Sm90TmaWarpSpecialized<kStagesC, kStagesD, kFragmentSize, kReuseSmemC, kDelayTmaStore>>
    : std::integral_constant<int, kStagesD> {};

/// The dispatch policy a program's epilogue is built with when it is not the builder's: the program's own, else
/// DeepStorePolicy with the config's kStagesD.
template <class Traits, class Program, class ElementC, bool = HasEpilogueDispatchPolicy<Program>::value>
struct DispatchPolicyOf {
  static_assert(Traits::kStagesD == 0, "a config's kStagesD on a program that names its own EpilogueDispatchPolicy");
  using type = typename Program::EpilogueDispatchPolicy;
};
template <class Traits, class Program, class ElementC>
struct DispatchPolicyOf<Traits, Program, ElementC, false> {
  using type = typename DeepStorePolicyOf<Traits, ElementC, Traits::kStagesD>::type;
};

/// The TMA op that writes D: the program's `using StoreOp = ...` (ReduceAddEpilogue's OneLaneTmaReduceAdd), else
/// the builder's SM90_TMA_STORE.
using DefaultStoreOp = cute::SM90_TMA_STORE;
template <class Program, class = void>
struct StoreOpOf {
  using type = DefaultStoreOp;
};
template <class Program>
struct StoreOpOf<Program, std::void_t<typename Program::StoreOp>> {
  using type = typename Program::StoreOp;
};

/// An sm90 TMA CollectiveEpilogue with its S2G copy op (the 12th template argument) replaced by
/// NewStore; everything else is the builder's.
template <class Collective, class NewStore>
struct ReplaceStoreOp;
template <class Policy, class Tile, class EpiTile, class EC, class SC, class ED, class SD, class Fusion, class G2S,
          class SmemC, class S2R, class S2G, class SmemD, class R2S, class AtomC, class R2R, class NewStore>
struct ReplaceStoreOp<cutlass::epilogue::collective::CollectiveEpilogue<Policy, Tile, EpiTile, EC, SC, ED, SD, Fusion,
                                                                        G2S, SmemC, S2R, S2G, SmemD, R2S, AtomC, R2R>,
                      NewStore> {
  using type = cutlass::epilogue::collective::CollectiveEpilogue<Policy, Tile, EpiTile, EC, SC, ED, SD, Fusion, G2S,
                                                                 SmemC, S2R, NewStore, SmemD, R2S, AtomC, R2R>;
};

/// The collective a program runs: the built one, or the program's `template <class Built> using WrapCollective`
/// around it (a pass over the accumulators before the subtile loop: epilogue/accumulator_prepass.hpp).
template <class Program, class Built, class = void>
struct WrapCollectiveOf {
  using type = Built;
};
template <class Program, class Built>
struct WrapCollectiveOf<Program, Built, std::void_t<typename Program::template WrapCollective<Built>>> {
  using type = typename Program::template WrapCollective<Built>;
};

/// CollectiveEpilogue of a program: CUTLASS's builder, or (when the program defines EpilogueDispatchPolicy, an
/// Sm90TmaWarpSpecialized<StagesC, StagesD, ...>, or the config names kStagesD) the builder's implementation with
/// that policy (DispatchPolicyOf); either with the program's store op (StoreOpOf) in the S2G slot; wrapped as the
/// program asks (WrapCollectiveOf).
template <class Config, class Traits, class Program, class ElementC, class LayoutC, int kAlignmentC, class ElementD,
          class LayoutD, int kAlignmentD,
          bool = HasEpilogueDispatchPolicy<Program>::value || (Traits::kStagesD > 0)>
struct EpilogueOf {
  using Built = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::TileShape, typename Config::ClusterShape,
      typename Traits::EpilogueTile, float, float, ElementC, LayoutC, kAlignmentC, ElementD, LayoutD, kAlignmentD,
      typename Config::EpilogueSchedule, typename Program::Fusion>::CollectiveOp;
  using type =
      typename WrapCollectiveOf<Program, typename ReplaceStoreOp<Built, typename StoreOpOf<Program>::type>::type>::type;
};
template <class Config, class Traits, class Program, class ElementC, class LayoutC, int kAlignmentC, class ElementD,
          class LayoutD, int kAlignmentD>
struct EpilogueOf<Config, Traits, Program, ElementC, LayoutC, kAlignmentC, ElementD, LayoutD, kAlignmentD, true> {
  using Built = typename cutlass::epilogue::collective::detail::Sm90TmaBuilderImpl<
      typename Config::TileShape, typename Traits::EpilogueTile, float, float, ElementC, LayoutC, kAlignmentC, ElementD,
      LayoutD, kAlignmentD, typename Program::Fusion,
      typename DispatchPolicyOf<Traits, Program, ElementC>::type>::CollectiveOp;
  using type =
      typename WrapCollectiveOf<Program, typename ReplaceStoreOp<Built, typename StoreOpOf<Program>::type>::type>::type;
};

}  // namespace detail

/// A config's epilogue subtile: its `using EpilogueTile = ...` when it names one, else what the CUTLASS builder
/// derives for EpilogueTileAuto.
template <class Config, class ElementD, class = void>
struct EpilogueTileOf {
  using type = decltype(cutlass::epilogue::collective::detail::sm90_compute_tile_shape_or_override<
                        ElementD, cutlass::epilogue::collective::EpilogueTileAuto, typename Config::EpilogueSchedule,
                        typename Config::TileShape>());
};
template <class Config, class ElementD>
struct EpilogueTileOf<Config, ElementD, std::void_t<typename Config::EpilogueTile>> {
  using type = typename Config::EpilogueTile;
};

/// What an epilogue program may depend on: the config, the output element and the epilogue sub-tile (the shape
/// each visit() covers: EpilogueTileOf).
template <class Config_, class ElementD_>
struct EpilogueTraits {
  using Config = Config_;
  using ElementD = ElementD_;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using TileShape = typename Config::TileShape;
  using EpilogueSchedule = typename Config::EpilogueSchedule;
  using EpilogueTile = typename EpilogueTileOf<Config_, ElementD_>::type;
  static constexpr cutlass::FloatRoundStyle kRound = cutlass::FloatRoundStyle::round_to_nearest;
  /// fp32 accumulators per consumer thread: 128 on the 128x128 pingpong and 128x256 cooperative tiles, 192 on the
  /// 128x192 and 192x128 pingpong tiles (the registers an epilogue has left beside them are what it may keep).
  static constexpr int kAccumulatorsPerThread =
      Config::kTileM * Config::kTileN / (Config::kPingpong ? 128 : 256);
  /// The config's D smem buffers (0: the builder's): FusedLinear builds the epilogue with DeepStorePolicy then.
  static constexpr int kStagesD = Config::kStagesD;
};

/// The builder's TMA epilogue policy for (Traits, ElementC) with up to `kStagesD` D smem buffers instead of its 2:
/// with 2, the epilogue waits after every sub-tile until at most one TMA store is in flight (12 waits per 128x192
/// tile); deeper, the stores of one tile drain behind the next sub-tiles' math (quack keeps up to 5 in flight).
/// For programs without a C source (ElementC void): nothing else shares the D buffers. A program opts in with
///   using EpilogueDispatchPolicy = gemm::DeepStorePolicy<Traits, void, 6>;
/// a config with `static constexpr int kStagesD = 3;` (pp_192x128x64_c1x2_d3), for every program that names no policy.
template <class Traits, class ElementC, int kStagesD>
struct DeepStorePolicyOf {
  static_assert(std::is_void_v<ElementC>, "DeepStorePolicy: programs without a C source only");
  using Builder = typename cutlass::epilogue::collective::detail::EpilogueDescriptor<
      typename Traits::TileShape, typename Traits::EpilogueTile, ElementC, typename Traits::ElementD,
      typename Traits::EpilogueSchedule>;
  static constexpr int kEpiTiles =
      cute::size(cute::shape_div(cute::take<0, 2>(typename Traits::TileShape{}), typename Traits::EpilogueTile{}));
  static constexpr int kStages = kStagesD < kEpiTiles ? kStagesD : kEpiTiles;
  using type =
      cutlass::epilogue::Sm90TmaWarpSpecialized<Builder::StagesC, kStages, Builder::DispatchPolicy::FragmentSize,
                                                Builder::DispatchPolicy::ReuseSmemC,
                                                Builder::DispatchPolicy::DelayTmaStore>;
};
template <class Traits, class ElementC, int kStagesD>
using DeepStorePolicy = typename DeepStorePolicyOf<Traits, ElementC, kStagesD>::type;

/// The D store stages of a program's epilogue when the program names no dispatch policy: the config's kStagesD
/// (DeepStorePolicy), else the builder's. An aux store node (Sm90AuxStore) indexes its smem buffers by the store
/// iteration modulo its own stage count, while the collective lets StagesD - 1 stores stay in flight: the node's
/// Stages must be at least this (the QK-norm program's z store takes it).
template <class Traits, class ElementC, bool = (Traits::kStagesD > 0)>
struct StoreStagesOf {
  static constexpr int value = cutlass::epilogue::collective::detail::EpilogueDescriptor<
      typename Traits::TileShape, typename Traits::EpilogueTile, ElementC, typename Traits::ElementD,
      typename Traits::EpilogueSchedule>::StagesD;
};
template <class Traits, class ElementC>
struct StoreStagesOf<Traits, ElementC, true> {
  static constexpr int value = DeepStorePolicyOf<Traits, ElementC, Traits::kStagesD>::kStages;
};

/// CUTLASS's EpilogueDescriptor for a program's aux load / store descriptors (AuxStoreDescriptor & co.), with StagesD
/// the collective's (StoreStagesOf) for programs that name no dispatch policy: an aux store built from it keeps as
/// many buffers as the D stores it shares the store pipeline with, whatever the config's kStagesD.
template <class Traits, class ElementC>
struct EpilogueDescriptorOf
    : cutlass::epilogue::collective::detail::EpilogueDescriptor<typename Traits::TileShape,
                                                                typename Traits::EpilogueTile, ElementC,
                                                                typename Traits::ElementD,
                                                                typename Traits::EpilogueSchedule> {
  static constexpr int StagesD = StoreStagesOf<Traits, ElementC>::value;
};

namespace detail {
/// Whether an epilogue has `static char const* check_args(Args const&)` (nullptr: accepted; else the rule).
template <class Epilogue, class = void>
struct HasCheckArgs : std::false_type {};
template <class Epilogue>
struct HasCheckArgs<Epilogue,
                    std::void_t<decltype(Epilogue::check_args(std::declval<typename Epilogue::Args const&>()))>>
    : std::true_type {};
}  // namespace detail

template <class Config, class Epilogue, class ElementAB, class ElementD, class LayoutA, class LayoutB>
struct FusedLinear {
  using Traits = EpilogueTraits<Config, ElementD>;
  using EpilogueArgs = typename Epilogue::Args;
  using Program = typename Epilogue::template Program<Traits>;
  using ElementC = typename Program::ElementC;
  using LayoutC = cutlass::layout::RowMajor;
  using LayoutD = cutlass::layout::RowMajor;

  static constexpr bool kAKMajor = std::is_same_v<LayoutA, cutlass::layout::RowMajor>;
  static constexpr bool kBKMajor = std::is_same_v<LayoutB, cutlass::layout::ColumnMajor>;
  static_assert(kAKMajor || std::is_same_v<LayoutA, cutlass::layout::ColumnMajor>, "LayoutA: RowMajor|ColumnMajor");
  static_assert(kBKMajor || std::is_same_v<LayoutB, cutlass::layout::RowMajor>, "LayoutB: RowMajor|ColumnMajor");

  static constexpr int kAlignmentAB = detail::alignment16<ElementAB>();
  static constexpr int kAlignmentD = detail::alignment16<ElementD>();
  static constexpr int kAlignmentC = std::is_void_v<ElementC> ? kAlignmentD : detail::alignment16<ElementC>();

  // The builder's epilogue, unless the program names its own dispatch policy (fewer C/D smem stages, so that a
  // long-K cooperative kernel keeps more mainloop stages) or the config its kStagesD (more D stages): then the
  // builder's implementation with that policy.
  using CollectiveEpilogue = typename detail::EpilogueOf<Config, Traits, Program, ElementC, LayoutC, kAlignmentC,
                                                         ElementD, LayoutD, kAlignmentD>::type;
  // A program's aux store nodes size their smem buffers by StoreStagesOf (EpilogueDescriptorOf): fewer than the
  // collective's D stages would let a buffer be rewritten while its TMA store still reads it.
  static_assert(detail::HasEpilogueDispatchPolicy<Program>::value ||
                    detail::PolicyStagesD<typename CollectiveEpilogue::DispatchPolicy>::value ==
                        StoreStagesOf<Traits, ElementC>::value,
                "StoreStagesOf differs from the collective's StagesD");
  /// D += the tile through TMA reduce-add (the program's StoreOp): the kernel adds into D in place.
  static constexpr bool kReduceAdd =
      std::is_base_of_v<cute::SM90_TMA_REDUCE_ADD, typename detail::StoreOpOf<Program>::type>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignmentAB, ElementAB, LayoutB,
      kAlignmentAB, float, typename Config::TileShape, typename Config::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Config::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, typename Config::Scheduler>;
  using Arguments = typename Kernel::Arguments;
  using Params = typename Kernel::Params;

  /// The kernel's function table (what a per-config .cu returns from its getter).
  static KernelOps<EpilogueArgs> const& ops() {
    static KernelOps<EpilogueArgs> const table{
        KernelInfo{Config::kName, Config::kTileM, Config::kTileN, Config::kTileK, Config::kClusterM,
                   Config::kClusterN, Config::kPingpong, Config::kStreamK,
                   std::is_same_v<typename Config::Scheduler, RaggedPersistentScheduler>},
        &check, &workspace_size, &run};
    return table;
  }

  static std::string check(Operands const& op, EpilogueArgs const& epi, Knobs const& knobs) {
    int device = 0;
    CODA_CUDA_CHECK(cudaGetDevice(&device));
    return reject(op, epi, knobs, device).reason;
  }

  static size_t workspace_size(Operands const& op, EpilogueArgs const& epi, Knobs const& knobs) {
    int device = 0;
    CODA_CUDA_CHECK(cudaGetDevice(&device));
    if (!reject(op, epi, knobs, device).reason.empty()) return 0;
    return Kernel::get_workspace_size(make_arguments(op, epi, knobs, device));
  }

  static void run(Operands const& op, EpilogueArgs const& epi, Knobs const& knobs, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream) {
    int device = 0;
    CODA_CUDA_CHECK(cudaGetDevice(&device));
    Rejection const r = reject(op, epi, knobs, device);
    if (!r.reason.empty()) coda::detail::fail(r.status, "GEMM kernel ", Config::kName, ": ", r.reason);

    Arguments const args = make_arguments(op, epi, knobs, device);
    size_t const need = Kernel::get_workspace_size(args);
    // (No CODA_REQUIRE in templates here: nvcc 13's front end mangles its decltype check inside class templates.)
    if (workspace_bytes < need) {
      coda::detail::fail(CODA_ERROR_WORKSPACE, "GEMM kernel ", Config::kName, " needs ", need,
                         " bytes of workspace, got ", workspace_bytes);
    }
    if (need != 0 && (workspace == nullptr || !detail::aligned16(workspace))) {
      coda::detail::fail(CODA_ERROR_WORKSPACE, "GEMM kernel ", Config::kName,
                         ": workspace must be a 16-byte aligned device pointer");
    }
    void* const ws = need == 0 ? nullptr : workspace;

    prepare_device(device);
    cutlass::Status const status = Kernel::initialize_workspace(args, ws, stream, nullptr);
    if (status != cutlass::Status::kSuccess) {
      cudaError_t const err = cudaGetLastError();
      coda::detail::fail(CODA_ERROR_CUDA, "GEMM kernel ", Config::kName, ": workspace initialisation failed (",
                         cutlass::cutlassGetStatusString(status), ", ", cudaGetErrorName(err), ")");
    }
    Params params = Kernel::to_underlying_arguments(args, ws);

    cudaLaunchConfig_t launch{};
    launch.gridDim = Kernel::get_grid_shape(params);
    launch.blockDim = Kernel::get_block_shape();
    launch.dynamicSmemBytes = static_cast<size_t>(Kernel::SharedStorageSize);
    launch.stream = stream;
    cudaLaunchAttribute attribute[2];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = Config::kClusterM;
    attribute[0].val.clusterDim.y = Config::kClusterN;
    attribute[0].val.clusterDim.z = 1;
    launch.attrs = attribute;
    launch.numAttrs = 1;
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
    bool const pdl = programmatic_launch();  // CODA_PDL (kernel_api.hpp): may start before the previous kernel ends
#else
    bool const pdl = false;  // compiled without the griddepcontrol wait (the stream-K kernels): never early
#endif
    if (pdl) {
      attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attribute[1].val.programmaticStreamSerializationAllowed = 1;
      launch.numAttrs = 2;
    }
    CODA_CUDA_CHECK(cudaLaunchKernelEx(&launch, &cutlass::device_kernel<Kernel>, params));
  }

 private:
  struct Rejection {
    coda_status status = CODA_SUCCESS;
    std::string reason;  // empty: accepted
  };

  template <class... Parts>
  static Rejection no(coda_status status, Parts&&... parts) {
    return Rejection{status, coda::detail::concat(std::forward<Parts>(parts)...)};
  }

  /// Every rule the kernel needs, with a message naming it; then CUTLASS's own can_implement.
  static Rejection reject(Operands const& op, EpilogueArgs const& epi, Knobs const& knobs, int device) {
    constexpr int64_t kIntMax = INT_MAX;
    if (op.M < 1 || op.N < 1 || op.K < 1 || op.M > kIntMax || op.N > kIntMax || op.K > kIntMax) {
      return no(CODA_ERROR_SHAPE, "M, N, K must be in [1, 2^31-1], got M=", op.M, " N=", op.N, " K=", op.K);
    }
    if (op.A == nullptr || op.B == nullptr) return no(CODA_ERROR_INVALID_ARGUMENT, "A or B is null");
    if constexpr (!std::is_void_v<ElementD>) {
      if (op.D == nullptr) return no(CODA_ERROR_INVALID_ARGUMENT, "D is null");
    }
    if (!detail::aligned16(op.A) || !detail::aligned16(op.B) || !detail::aligned16(op.C) ||
        !detail::aligned16(op.D)) {
      return no(CODA_ERROR_MISALIGNED, "A, B, C and D must be 16-byte aligned (TMA)");
    }
    // Contiguous extents and leading dimensions must be whole 16-byte units (TMA); ld covers the extent.
    int64_t const a_contig = kAKMajor ? op.K : op.M;
    int64_t const a_rows = kAKMajor ? op.M : op.K;
    int64_t const b_contig = kBKMajor ? op.K : op.N;
    int64_t const b_rows = kBKMajor ? op.N : op.K;
    if (a_contig % kAlignmentAB != 0) {
      return no(CODA_ERROR_SHAPE, "A is ", kAKMajor ? "K" : "M", "-major: ", kAKMajor ? "K" : "M", "=", a_contig,
                " must be a multiple of ", kAlignmentAB);
    }
    if (b_contig % kAlignmentAB != 0) {
      return no(CODA_ERROR_SHAPE, "B is ", kBKMajor ? "K" : "N", "-major: ", kBKMajor ? "K" : "N", "=", b_contig,
                " must be a multiple of ", kAlignmentAB);
    }
    if ((a_rows > 1 && (op.lda < a_contig || op.lda % kAlignmentAB != 0)) ||
        (b_rows > 1 && (op.ldb < b_contig || op.ldb % kAlignmentAB != 0))) {
      return no(CODA_ERROR_MISALIGNED, "lda=", op.lda, " / ldb=", op.ldb, " must cover the contiguous extent and be",
                " multiples of ", kAlignmentAB, " elements");
    }
    if constexpr (!std::is_void_v<ElementD>) {
      if (op.N % kAlignmentD != 0 || (op.M > 1 && (op.ldd < op.N || op.ldd % kAlignmentD != 0))) {
        return no(CODA_ERROR_SHAPE, "D: N=", op.N, " and ldd=", op.ldd, " must be multiples of ", kAlignmentD,
                  " with ldd >= N");
      }
    }
    if constexpr (!std::is_void_v<ElementC>) {
      if (op.C != nullptr && (op.N % kAlignmentC != 0 || (op.M > 1 && (op.ldc < op.N || op.ldc % kAlignmentC != 0)))) {
        return no(CODA_ERROR_SHAPE, "C: N=", op.N, " and ldc=", op.ldc, " must be multiples of ", kAlignmentC,
                  " with ldc >= N");
      }
    }
    if constexpr (detail::HasCheckArgs<Epilogue>::value) {
      if (char const* why = Epilogue::check_args(epi)) return no(CODA_ERROR_INVALID_ARGUMENT, why);
    }
    if constexpr (kReduceAdd) {
      if (op.C != nullptr && op.C != op.D) {
        return no(CODA_ERROR_INVALID_ARGUMENT,
                  "this kernel adds into D in place (TMA reduce-add): C must be D or null");
      }
    }
    if (knobs.swizzle != 1 && knobs.swizzle != 2 && knobs.swizzle != 4 && knobs.swizzle != 8) {
      return no(CODA_ERROR_INVALID_ARGUMENT, "swizzle must be 1, 2, 4 or 8, got ", knobs.swizzle);
    }
    if (knobs.splits < 1 || knobs.splits > 64) {
      return no(CODA_ERROR_INVALID_ARGUMENT, "splits must be in [1, 64], got ", knobs.splits);
    }
    if constexpr (!Config::kStreamK) {
      if (knobs.decomposition == Decomposition::kSplitK || knobs.decomposition == Decomposition::kStreamK ||
          knobs.splits != 1) {
        return no(CODA_ERROR_INVALID_ARGUMENT, "split-K / stream-K knobs need a stream-K config (sk_*)");
      }
    } else {
      if (knobs.splits != 1 && knobs.decomposition != Decomposition::kSplitK &&
          knobs.decomposition != Decomposition::kHeuristic) {
        return no(CODA_ERROR_INVALID_ARGUMENT, "splits > 1 needs the split-K (or heuristic) decomposition");
      }
    }
    if (!Kernel::can_implement(make_arguments(op, epi, knobs, device))) {
      return no(CODA_ERROR_SHAPE, "CUTLASS can_implement rejected M=", op.M, " N=", op.N, " K=", op.K, " lda=",
                op.lda, " ldb=", op.ldb, " ldd=", op.ldd);
    }
    return {};
  }

  static Arguments make_arguments(Operands const& op, EpilogueArgs const& epi, Knobs const& knobs, int device) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    int const M = static_cast<int>(op.M), N = static_cast<int>(op.N), K = static_cast<int>(op.K);

    Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = cute::make_shape(M, N, K, 1);
    args.mainloop.ptr_A = static_cast<ElementAB const*>(op.A);
    int64_t const a_rows = kAKMajor ? op.M : op.K, b_rows = kBKMajor ? op.N : op.K;
    int64_t const lda = detail::effective_ld(op.lda, a_rows, kAKMajor ? op.K : op.M, kAlignmentAB);
    int64_t const ldb = detail::effective_ld(op.ldb, b_rows, kBKMajor ? op.K : op.N, kAlignmentAB);
    args.mainloop.dA = detail::make_stride_from_ld<StrideA>(lda, lda * a_rows);
    args.mainloop.ptr_B = static_cast<ElementAB const*>(op.B);
    args.mainloop.dB = detail::make_stride_from_ld<StrideB>(ldb, ldb * b_rows);
    if constexpr (!std::is_void_v<ElementC>) {
      args.epilogue.ptr_C = static_cast<ElementC const*>(op.C);
      int64_t const ldc = detail::effective_ld(op.C != nullptr ? op.ldc : op.N, op.M, op.N, kAlignmentC);
      args.epilogue.dC = detail::make_stride_from_ld<StrideC>(ldc, ldc * op.M);
    }
    if constexpr (!std::is_void_v<ElementD>) {
      args.epilogue.ptr_D = static_cast<ElementD*>(op.D);
      int64_t const ldd = detail::effective_ld(op.ldd, op.M, op.N, kAlignmentD);
      args.epilogue.dD = detail::make_stride_from_ld<StrideD>(ldd, ldd * op.M);
    }
    Program::make_args(args.epilogue.thread, epi, op);

    args.hw_info.device_id = device;
    args.hw_info.sm_count = device_sm_count(device);
    args.hw_info.max_active_clusters = max_active_clusters(device);

    using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size = knobs.swizzle;
    args.scheduler.raster_order = knobs.raster == Raster::kAlongM   ? RasterOrderOptions::AlongM
                                  : knobs.raster == Raster::kAlongN ? RasterOrderOptions::AlongN
                                                                    : RasterOrderOptions::Heuristic;
    if constexpr (Config::kStreamK) {
      using Mode = cutlass::gemm::kernel::detail::DecompositionMode;
      args.scheduler.splits = knobs.splits;
      args.scheduler.reduction_mode = cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
      switch (knobs.decomposition) {
        case Decomposition::kDataParallel: args.scheduler.decomposition_mode = Mode::DataParallel; break;
        case Decomposition::kSplitK: args.scheduler.decomposition_mode = Mode::SplitK; break;
        case Decomposition::kStreamK: args.scheduler.decomposition_mode = Mode::StreamK; break;
        default: args.scheduler.decomposition_mode = Mode::Heuristic; break;
      }
    }
    return args;
  }

  /// Once per device: allow the kernel's dynamic shared memory (> 48 KiB needs the opt-in attribute).
  static void prepare_device(int device) {
    static std::atomic<bool> done[detail::kMaxCachedDevices] = {};
    bool const cached = device >= 0 && device < detail::kMaxCachedDevices;
    if (cached && done[device].load(std::memory_order_acquire)) return;
    int const smem = Kernel::SharedStorageSize;
    if (smem >= (48 << 10)) {
      CODA_CUDA_CHECK(cudaFuncSetAttribute(&cutlass::device_kernel<Kernel>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    if (cached) done[device].store(true, std::memory_order_release);
  }

  /// Clusters of this kernel that fit on the device at once (sizes the persistent grid exactly; without it the
  /// scheduler falls back to a GPC-based estimate). 0 for 1x1 clusters (not used) or when the query fails.
  static int max_active_clusters(int device) {
    if constexpr (Config::kClusterM * Config::kClusterN == 1) {
      return 0;
    } else {
      static std::atomic<int> cache[detail::kMaxCachedDevices] = {};  // value + 1; 0 = not queried yet
      bool const cached = device >= 0 && device < detail::kMaxCachedDevices;
      if (cached) {
        int const v = cache[device].load(std::memory_order_acquire);
        if (v != 0) return v - 1;
      }
      prepare_device(device);
      cudaLaunchConfig_t launch{};
      launch.gridDim = dim3(Config::kClusterM, Config::kClusterN, 1);
      launch.blockDim = Kernel::get_block_shape();
      launch.dynamicSmemBytes = static_cast<size_t>(Kernel::SharedStorageSize);
      cudaLaunchAttribute attribute[1];
      attribute[0].id = cudaLaunchAttributeClusterDimension;
      attribute[0].val.clusterDim.x = Config::kClusterM;
      attribute[0].val.clusterDim.y = Config::kClusterN;
      attribute[0].val.clusterDim.z = 1;
      launch.attrs = attribute;
      launch.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, &cutlass::device_kernel<Kernel>, &launch) != cudaSuccess) {
        (void)cudaGetLastError();  // clear; fall back to CUTLASS's estimate
        clusters = 0;
      }
      if (cached) cache[device].store(clusters + 1, std::memory_order_release);
      return clusters;
    }
  }
};

}  // namespace coda::gemm
