// Named arguments for an epilogue visitor tree (CUTLASS-heavy; include only from epilogue programs).
//
// CUTLASS nests a tree's run-time arguments as its shape: Sm90EVT<Node, Children...> takes {children..., node}
// (Sm90SplitTreeVisitor {input, aux outputs..., output}), as members op_0..op_3 up to four entries and as a
// cute::tuple above. A program that fills them by position
// (`out.op_1.op_0.op_1.ptr_row`) breaks silently when its tree changes. Here a program names a node by its type and
// sets the arguments of every node of that type wherever it sits:
//
//   epilogue::for_each_node<Rstd, Fusion>(out, [&](auto& a) { epilogue::set_column_vector(a, args.rstd, op.M); });
//   epilogue::node_args<ZStore, Fusion>(out).ptr_aux = args.z;   // exactly one node of that type
//
// A node type that appears twice (one loaded vector read by two subtrees) gets the same arguments at both places; two
// leaves of one kind that carry different vectors (linear_residual_rmsnorm_bwd's rstd and zdz, both ColumnVector) need
// distinct types: Named<Node, Name> below, with the shared names in broadcast.hpp.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace coda::epilogue {

/// `Node` under a name of its own: the same node (Arguments, Params, callbacks), a distinct type for lookups.
template <class Node, class Name>
struct Named : Node {
  using Node::Node;
};

namespace detail {

template <class... Ts>
struct TypeList {};

/// The ops whose arguments a visitor takes, in order: {children..., node} for a tree visitor, {input, aux outputs...,
/// output} for a split tree, nothing for a leaf.
template <class Visitor>
struct TreeOps {
  static constexpr bool kTree = false;
};
template <class NodeOp, class... ChildOps>
struct TreeOps<cutlass::epilogue::fusion::Sm90TreeVisitor<NodeOp, ChildOps...>> {
  static constexpr bool kTree = true;
  using Ops = TypeList<ChildOps..., NodeOp>;
  static constexpr std::size_t kCount = sizeof...(ChildOps) + 1;
};
template <class InputTree, class OutputTree, class... AuxOutTrees>
struct TreeOps<cutlass::epilogue::fusion::Sm90SplitTreeVisitor<InputTree, OutputTree, AuxOutTrees...>> {
  static constexpr bool kTree = true;
  using Ops = TypeList<InputTree, AuxOutTrees..., OutputTree>;
  static constexpr std::size_t kCount = sizeof...(AuxOutTrees) + 2;
};

template <class A, class = void>
struct HasNamedEntries : std::false_type {};
template <class A>
struct HasNamedEntries<A, std::void_t<decltype(std::declval<A&>().op_0)>> : std::true_type {};

/// Entry I of a visitor's Arguments (CUTLASS's op_0..op_3 members, else its tuple, whose get returns an empty
/// entry, e.g. an accumulator fetch's, by value).
template <std::size_t I, class A>
decltype(auto) arguments_entry(A& a) {
  if constexpr (HasNamedEntries<A>::value) {
    static_assert(I < 4, "named Arguments entries go up to op_3");
    if constexpr (I == 0) {
      return (a.op_0);
    } else if constexpr (I == 1) {
      return (a.op_1);
    } else if constexpr (I == 2) {
      return (a.op_2);
    } else {
      return (a.op_3);
    }
  } else {
    return cute::get<I>(a);
  }
}

template <class Target, class Visitor>
constexpr int count_nodes();

template <class Target, class... Ops>
constexpr int count_in(TypeList<Ops...>) {
  return (0 + ... + count_nodes<Target, Ops>());
}

template <class Target, class Visitor>
constexpr int count_nodes() {
  if constexpr (std::is_same_v<Target, Visitor>) {
    return 1;
  } else if constexpr (TreeOps<Visitor>::kTree) {
    return count_in<Target>(typename TreeOps<Visitor>::Ops{});
  } else {
    return 0;
  }
}

template <class Target, class Visitor, class A, class F>
void visit_nodes(A&& a, F& f);

template <class Target, class... Ops, class A, class F, std::size_t... I>
void visit_entries(TypeList<Ops...>, A& a, F& f, std::index_sequence<I...>) {
  (visit_nodes<Target, Ops>(arguments_entry<I>(a), f), ...);
}

template <class Target, class Visitor, class A, class F>
void visit_nodes(A&& a, F& f) {
  if constexpr (std::is_same_v<Target, Visitor>) {
    f(a);
  } else if constexpr (TreeOps<Visitor>::kTree) {
    visit_entries<Target>(typename TreeOps<Visitor>::Ops{}, a, f,
                          std::make_index_sequence<TreeOps<Visitor>::kCount>{});
  }
}

}  // namespace detail

/// How many nodes of type Node the tree Fusion holds.
template <class Node, class Fusion>
inline constexpr int kNodeCount = detail::count_nodes<Node, Fusion>();

/// Calls f(arguments) for every node of type Node in the tree Fusion, whose Arguments are `args`; Node must occur.
template <class Node, class Fusion, class FusionArguments, class F>
void for_each_node(FusionArguments& args, F&& f) {
  static_assert(kNodeCount<Node, Fusion> > 0, "for_each_node: the epilogue tree has no node of this type");
  detail::visit_nodes<Node, Fusion>(args, f);
}

/// The Arguments of the one node of type Node in the tree Fusion.
template <class Node, class Fusion, class FusionArguments>
auto& node_args(FusionArguments& args) {
  static_assert(kNodeCount<Node, Fusion> == 1,
                "node_args: the node type must occur exactly once in the tree (for_each_node sets repeated ones; "
                "Named<Node, Name> tells apart leaves of one kind)");
  static_assert(!std::is_empty_v<typename Node::Arguments>, "node_args: this node takes no arguments");
  typename Node::Arguments* found = nullptr;
  auto take = [&](auto& a) { found = &a; };
  detail::visit_nodes<Node, Fusion>(args, take);
  return *found;
}

}  // namespace coda::epilogue
