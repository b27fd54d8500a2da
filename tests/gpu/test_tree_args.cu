// epilogue/tree_args.hpp on real CUTLASS trees, host only (runs without a GPU): node_args and for_each_node reach
// the argument slots that CUTLASS's positional nesting gives each node, for the op programs whose trees have
// repeated nodes (linear_residual_rmsnorm_bwd), a tuple of more than four entries (linear_rowscale_rope) and a split
// tree (linear_residual_rmsnorm).
#include "epilogue/broadcast.hpp"
#include "epilogue/tree_args.hpp"
#include "gemm/configs.hpp"
#include "ops/linear_residual_rmsnorm/epilogue.hpp"
#include "ops/linear_residual_rmsnorm_bwd/epilogue.hpp"
#include "ops/linear_rowscale_rope/epilogue.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace {

using coda::gemm::Operands;
namespace cfg = coda::gemm::config;
namespace ops = coda::ops;

template <class Kernel>
using ProgramOf = typename Kernel::Program;
template <class Kernel>
using FusionArgumentsOf =
    std::remove_reference_t<decltype(std::declval<typename Kernel::Arguments&>().epilogue.thread)>;

template <class T>
T const* fake(uintptr_t address) {
  return reinterpret_cast<T const*>(address);
}

Operands problem() {
  Operands op;
  op.M = 1000;
  op.N = 776;
  op.K = 264;
  return op;
}

TEST(TreeArgs, CountsNodesByType) {
  using P = ProgramOf<ops::ResidualRmsnormBwdKernel<cfg::Pp128x128x64C2x1>>;
  static_assert(coda::epilogue::kNodeCount<typename P::Rstd, typename P::Fusion> == 2, "rstd: c and dx");
  static_assert(coda::epilogue::kNodeCount<typename P::Gamma, typename P::Fusion> == 2, "gamma: a and dx");
  static_assert(coda::epilogue::kNodeCount<typename P::Zdz, typename P::Fusion> == 1, "zdz: dx only");
  using PV = ProgramOf<ops::ResidualRmsnormBwdRowScaledKernel<cfg::Pp128x128x64C2x1>>;
  static_assert(coda::epilogue::kNodeCount<typename PV::V, typename PV::Fusion> == 3, "v: a, dgamma and dx");
  // Named leaves of one kind are told apart; the bare kind matches none of them.
  static_assert(coda::epilogue::kNodeCount<coda::epilogue::ColumnVector<typename P::TileShape>, typename P::Fusion> ==
                    0,
                "unnamed ColumnVector");
  SUCCEED();
}

TEST(TreeArgs, ResidualRmsnormBwdArgumentsReachTheirPositions) {
  using Kernel = ops::ResidualRmsnormBwdRowScaledKernel<cfg::Coop128x256x64C2x1>;
  using P = ProgramOf<Kernel>;
  ops::ResidualRmsnormBwdArgs args;
  args.alpha = 0.25f;
  args.x = fake<void>(0x1000);
  args.ldx = 808;
  args.gamma = fake<void>(0x2000);
  args.rstd = fake<float>(0x3000);
  args.zdz = fake<float>(0x4000);
  args.a = const_cast<void*>(static_cast<void const*>(fake<char>(0x5000)));
  args.lda = 816;
  args.dgamma_partials = const_cast<float*>(fake<float>(0x6000));
  args.row_scale = fake<float>(0x7000);
  FusionArgumentsOf<Kernel> out{};
  P::make_args(out, args, problem());
  // CUTLASS's nesting: root {acc, c", gamma, rstd, zdz, dx_in, v, node}; c" = {c', v, tap}; c' = {c, gamma, v, tap};
  // c = {x, rstd, node}.
  auto& cg = cute::get<1>(out);
  auto& ca = cg.op_0;
  auto& c = ca.op_0;
  EXPECT_EQ(c.op_0.ptr_aux, args.x);
  EXPECT_EQ(cute::get<0>(c.op_0.dAux), 808);
  EXPECT_EQ(c.op_1.ptr_col, args.rstd);
  EXPECT_EQ(cute::get<3>(out).ptr_col, args.rstd);
  EXPECT_EQ(cute::get<2>(c.op_1.dCol), 1000);
  EXPECT_EQ(static_cast<void const*>(ca.op_1.ptr_row), args.gamma);
  EXPECT_EQ(static_cast<void const*>(cute::get<2>(out).ptr_row), args.gamma);
  EXPECT_EQ(cute::get<2>(cute::get<2>(out).dRow), 776);
  EXPECT_EQ(cute::get<4>(out).ptr_col, args.zdz);
  EXPECT_EQ(ca.op_2.ptr_col, args.row_scale);
  EXPECT_EQ(cg.op_1.ptr_col, args.row_scale);
  EXPECT_EQ(cute::get<6>(out).ptr_col, args.row_scale);
  EXPECT_EQ(static_cast<void*>(ca.op_3.ptr_aux), args.a);
  EXPECT_EQ(cute::get<0>(ca.op_3.dAux), 816);
  EXPECT_EQ(cg.op_2.ptr, args.dgamma_partials);
  EXPECT_EQ(cg.op_2.ld, 1024);  // N rounded up to the 256-column tile
  EXPECT_EQ(cute::get<7>(out).alpha, 0.25f);
}

TEST(TreeArgs, RopeTupleOfFiveEntries) {
  using Kernel = ops::RopeKernel<cfg::Pp128x128x64C2x1>;
  ops::RopeArgs args;
  args.rstd = fake<float>(0x1100);
  args.positions = fake<int32_t>(0x2200);
  args.inv_freq_cols = fake<float>(0x3300);
  FusionArgumentsOf<Kernel> out{};
  ProgramOf<Kernel>::make_args(out, args, problem());
  // {acc, rstd, positions, inv_freq, node}: a cute::tuple.
  EXPECT_EQ(cute::get<1>(out).ptr_col, args.rstd);
  EXPECT_EQ(cute::get<2>(out).ptr_col, args.positions);
  EXPECT_EQ(cute::get<3>(out).ptr_row, args.inv_freq_cols);
  EXPECT_EQ(cute::get<2>(cute::get<3>(out).dRow), 776);
}

TEST(TreeArgs, ResidualRmsnormSplitTree) {
  using Kernel = ops::ResidualRmsnormKernel<cfg::Pp128x128x64C2x1>;
  ops::ResidualRmsnormArgs args;
  args.gamma = fake<void>(0x1230);
  args.h = const_cast<void*>(static_cast<void const*>(fake<char>(0x4560)));
  args.ldh = 784;
  args.partials = const_cast<float*>(fake<float>(0x7890));
  FusionArgumentsOf<Kernel> out{};
  ProgramOf<Kernel>::make_args(out, args, problem());
  // {x, h {multiply {fetch, gamma, node}, aux store}, D {fetch, row partials}}
  EXPECT_EQ(static_cast<void const*>(out.op_1.op_0.op_1.ptr_row), args.gamma);
  EXPECT_EQ(static_cast<void*>(out.op_1.op_1.ptr_aux), args.h);
  EXPECT_EQ(cute::get<0>(out.op_1.op_1.dAux), 784);
  EXPECT_EQ(out.op_2.op_1.ptr_partials, args.partials);
}

}  // namespace
