# The kernel registry. Each src/ops/<op>/op.cmake describes its fused op with one coda_fused_op() call: the kernels
# the build compiles and the tile policy that picks among them; src/gemm/plain.cmake lists the plain GEMM's kernels
# (coda_plain_gemm(), below). After all of them, coda_registry_generate(). The configure step writes, under
# ${CODA_GENERATED_DIR}:
#   ops/<op>/<getter>.cu         one kernel instantiation per file (CUTLASS-heavy; the files are libcoda sources)
#   ops/<op>/instances.hpp       the getters' declarations and each pinnable kernel kind's choose*() (the policy)
#   ops/fused_ops_table.hpp      every pinnable op's bf16 configs: what CODA_OP_CONFIG is checked against and what
#                                coda_fused_op_configs() hands to the GPU tests and the benchmarks
#   ops/fused_ops_policy.hpp     every pinnable kernel kind's choose*() by name, for coda_fused_op_choice()
#   gemm/*.cu, gemm/plain_instances.hpp, gemm/plain_entries.inc   the plain GEMM's instances, declarations, table
#   kernel_sources.txt           every generated instance, one per line (tools/kernel-stages)
# Files are rewritten only when their text changes, so a reconfigure recompiles nothing that did not change.
#
# coda_fused_op(<op>                        folder src/ops/<op>, C ABI name coda_<op>
#   ARGS <struct>                            the epilogue's run-time argument struct (ops/<op>/kernels.hpp)
#   NAMESPACE <ns>                           the getters' namespace, inside coda::ops
#   LAYOUT fwd|dgrad                         the getters' name prefix (the operand layout is the kernel alias's)
#   KERNEL <alias> [VARIANT <tag>]           a kernel kind: <alias> is a template <class Config, class Element> in
#                                            ops/<op>/epilogue.hpp; <tag> names its getters and chooser
#     [BF16 <config>...] [FP16 <config>...]  the configs compiled per element type
#     [ACCEPT_SPILL <config> <bytes>]...     measured exceptions to ptxas's spill and local-memory errors
#     [DEFAULT <config> <raster> <swizzle>]  makes the kind pinnable: the kernel and knobs no RULE overrides
#     [RULE "<condition>" <config> <raster> <swizzle> "<why>"]...
#   [KERNEL ...])
# Each (dtype, config) becomes the getter <layout>_<dtype>[_<tag>]_<config>() returning
# <alias><gemm::config::<Config>, <element>>::ops(), <Config> being the config's name in CamelCase
# (pp_128x192x64_c2x1_e16 -> Pp128x192x64C2x1E16; a static_assert checks the struct's kName against the name).
#
# The tile policy of a pinnable kind is its choose() (the first KERNEL) or choose_<tag>(): (fp16, M, N, K) -> the
# kernel CODA_OP_CONFIG pins (with its knobs), else the first RULE whose condition (a C++ expression in M, N, K, the
# GEMM's extents, and fp16) holds, else the DEFAULT. <raster> is h (CUTLASS's heuristic), m or n; <swizzle> 1, 2, 4
# or 8, the most the chooser uses: it halves it while CUTLASS's padding of the tile grid to the swizzle would add more
# than 1/8 to the tiles the problem needs (gemm::fit_swizzle, src/gemm/tile_grid.hpp; not for ragged-scheduler
# kernels, which pad nothing; a pin's knobs run as given).
# A kind compiles at most one FP16 config. A RULE whose config the kind does not compile for fp16 applies to bf16
# only (fp16 goes on to the next RULE, and at the DEFAULT runs its one kernel at the DEFAULT knobs). No RULE
# word may be a keyword of this function or contain a ';'. <why> is one line, carried into the generated code; the
# measurements behind it go in comments above the RULE. The first KERNEL's BF16 list is the op's config list (the
# table's entry); a later pinnable kind needs the same list, since a pin names one config for the whole op.
# Each ACCEPT_SPILL exempts one kernel from the errors up to <bytes> of spill stores, checked by the ctest SpillCheck.*
# (src/CMakeLists.txt says when a kernel may be exempt).

set(CODA_GENERATED_DIR ${CMAKE_CURRENT_BINARY_DIR}/generated)
set_property(GLOBAL PROPERTY CODA_KERNEL_INSTANCES "")
set_property(GLOBAL PROPERTY CODA_FUSED_OP_TABLE "")
set_property(GLOBAL PROPERTY CODA_SPILL_ACCEPTED "")
set_property(GLOBAL PROPERTY CODA_FUSED_OP_POLICIES "")
set_property(GLOBAL PROPERTY CODA_PLAIN_GEMM_ENTRIES "")

function(_coda_config_struct out config)  # pp_128x192x64_c2x1_e16 -> Pp128x192x64C2x1E16 (also fwd -> Fwd)
  string(REPLACE "_" ";" parts "${config}")
  set(name "")
  foreach(part IN LISTS parts)
    string(SUBSTRING "${part}" 0 1 head)
    string(SUBSTRING "${part}" 1 -1 tail)
    string(TOUPPER "${head}" head)
    string(APPEND name "${head}${tail}")
  endforeach()
  set(${out} "${name}" PARENT_SCOPE)
endfunction()

function(_coda_registry_error op what)
  message(FATAL_ERROR "src/ops/${op}/op.cmake: ${what}")
endfunction()

# A clause's words: `count` of them, the first one of `configs` (lists passed quoted), else the error `what`.
function(_coda_expect_words op words count configs what)
  list(LENGTH words n)
  set(first "")
  if(n GREATER 0)
    list(GET words 0 first)
  endif()
  if(NOT n EQUAL count OR NOT first IN_LIST configs)
    _coda_registry_error(${op} "${what}")
  endif()
endfunction()

function(_coda_knobs out op raster swizzle)  # "n" "8" -> raster_n(8)
  if(NOT swizzle MATCHES "^(1|2|4|8)$")
    _coda_registry_error(${op} "swizzle must be 1, 2, 4 or 8, got '${swizzle}'")
  endif()
  if(raster STREQUAL "n" OR raster STREQUAL "m")
    set(${out} "raster_${raster}(${swizzle})" PARENT_SCOPE)
  elseif(raster STREQUAL "h" AND swizzle STREQUAL "1")
    set(${out} "gemm::Knobs{}" PARENT_SCOPE)
  else()
    _coda_registry_error(${op} "raster must be m, n or h (h: swizzle 1), got '${raster} ${swizzle}'")
  endif()
endfunction()

function(coda_fused_op op)
  # Parse: the op's keys, then per KERNEL clause k (0, 1, ...) the variables k<k>_<field>. A key that takes one word
  # (ARGS, NAMESPACE, LAYOUT, KERNEL's alias, VARIANT) refuses a second; each RULE takes exactly five.
  set(key "")
  set(n -1)
  set(words 0)  # the words after the current key
  foreach(word IN LISTS ARGN ITEMS KERNEL)  # a trailing KERNEL closes the last RULE's count; dropped below
    if(word MATCHES "^(ARGS|NAMESPACE|LAYOUT|KERNEL|VARIANT|BF16|FP16|ACCEPT_SPILL|DEFAULT|RULE)$")
      if(key STREQUAL "RULE" AND NOT words EQUAL 5)
        _coda_registry_error(${op}
                             "RULE takes \"<condition>\" <config> <raster> <swizzle> \"<why>\", got ${words} words")
      endif()
      set(key ${word})
      set(words 0)
      if(word STREQUAL "KERNEL")
        math(EXPR n "${n} + 1")
        foreach(field alias tag bf16 fp16 spill default rule)
          set(k${n}_${field} "")
        endforeach()
      elseif(n LESS 0 AND NOT word MATCHES "^(ARGS|NAMESPACE|LAYOUT)$")
        _coda_registry_error(${op} "${word} before the first KERNEL")
      endif()
      continue()
    endif()
    math(EXPR words "${words} + 1")
    if(key MATCHES "^(ARGS|NAMESPACE|LAYOUT|KERNEL|VARIANT)$" AND words GREATER 1)
      _coda_registry_error(${op} "${key} takes one word, got a second: '${word}'")
    endif()
    if(key MATCHES "^(ARGS|NAMESPACE|LAYOUT)$")
      if(NOT n LESS 0)
        _coda_registry_error(${op} "${key} after the first KERNEL")
      endif()
      set(op_${key} "${word}")
    elseif(key STREQUAL "KERNEL")
      set(k${n}_alias "${word}")
    elseif(key STREQUAL "VARIANT")
      set(k${n}_tag "${word}")
    elseif(key MATCHES "^(BF16|FP16)$")
      string(TOLOWER ${key} field)
      if("${word}" IN_LIST k${n}_${field})
        _coda_registry_error(${op} "${key} lists ${word} twice")
      endif()
      list(APPEND k${n}_${field} "${word}")
    elseif(key STREQUAL "ACCEPT_SPILL" OR key STREQUAL "DEFAULT")
      string(TOLOWER ${key} field)
      string(REPLACE "accept_" "" field ${field})  # ACCEPT_SPILL -> spill
      list(APPEND k${n}_${field} "${word}")
    elseif(key STREQUAL "RULE")
      list(APPEND k${n}_rule "${word}")
    else()
      _coda_registry_error(${op} "unexpected '${word}'")
    endif()
  endforeach()
  math(EXPR n "${n} - 1")  # the trailing KERNEL
  if(NOT DEFINED op_ARGS OR NOT DEFINED op_NAMESPACE OR NOT op_LAYOUT MATCHES "^(fwd|dgrad)$" OR n LESS 0)
    _coda_registry_error(${op} "needs ARGS, NAMESPACE, LAYOUT fwd|dgrad and at least one KERNEL")
  endif()
  set(tags "")
  foreach(k RANGE ${n})
    if("${k${k}_alias}" STREQUAL "")
      _coda_registry_error(${op} "KERNEL ${k} names no alias")
    endif()
    if(k GREATER 0 AND "${k${k}_tag}" STREQUAL "")
      _coda_registry_error(${op} "KERNEL ${k${k}_alias} needs a VARIANT (its getters would be the first kind's)")
    endif()
    if(k GREATER 0 AND "${k${k}_tag}" IN_LIST tags)
      _coda_registry_error(${op} "VARIANT ${k${k}_tag} twice")
    endif()
    list(APPEND tags "${k${k}_tag}")
  endforeach()
  set(args ${op_ARGS})
  set(ns ${op_NAMESPACE})
  set(layout ${op_LAYOUT})

  set(dir ${CODA_GENERATED_DIR}/ops/${op})
  set(declarations "")
  set(choosers "")
  set(sources "")
  set(table_bf16 "")
  foreach(k RANGE ${n})
    set(alias ${k${k}_alias})
    set(tag ${k${k}_tag})
    set(bf16 ${k${k}_bf16})
    set(fp16 ${k${k}_fp16})
    set(spill ${k${k}_spill})
    set(default ${k${k}_default})
    set(rule ${k${k}_rule})
    set(infix "")
    if(NOT "${tag}" STREQUAL "")
      set(infix "_${tag}")
    endif()
    foreach(config IN LISTS bf16)
      unset(spill_bytes_${config})
    endforeach()
    list(LENGTH spill count)
    set(i 0)
    while(i LESS count)  # (config, bytes) pairs
      math(EXPR i1 "${i} + 1")
      set(pair "")
      list(SUBLIST spill ${i} 2 pair)
      _coda_expect_words(${op} "${pair}" 2 "${bf16}"
                         "ACCEPT_SPILL takes a config ${alias} compiles for bf16 and a byte count")
      list(GET pair 0 exempt)
      list(GET pair 1 bytes)
      if(NOT bytes MATCHES "^[0-9]+$")
        _coda_registry_error(${op} "ACCEPT_SPILL's byte count must be a number, got '${bytes}'")
      endif()
      if(DEFINED spill_bytes_${exempt})
        _coda_registry_error(${op} "ACCEPT_SPILL names ${exempt} twice")
      endif()
      set(spill_bytes_${exempt} ${bytes})
      math(EXPR i "${i} + 2")
    endwhile()

    # The instances.
    foreach(dtype bf16 fp16)
      set(element cutlass::bfloat16_t)
      if(dtype STREQUAL "fp16")
        set(element cutlass::half_t)
      endif()
      foreach(config IN LISTS ${dtype})
        _coda_config_struct(config_struct ${config})
        set(getter ${layout}_${dtype}${infix}_${config})
        set(getter_${dtype}_${config} ${getter})
        string(APPEND declarations "gemm::KernelOps<${args}> const& ${getter}();\n")
        file(CONFIGURE OUTPUT ${dir}/${getter}.cu @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/ops/${op}/op.cmake: do not edit.
// ${alias}, ${dtype}, config ${config} (one kernel instantiation per file).
#include \"gemm/config_name.hpp\"
#include \"ops/${op}/epilogue.hpp\"

namespace coda::ops::${ns} {

static_assert(gemm::config::is_named<gemm::config::${config_struct}>(\"${config}\"),
              \"src/ops/${op}/op.cmake: gemm::config::${config_struct} is not named ${config}\");

gemm::KernelOps<${args}> const& ${getter}() {
  return ${alias}<gemm::config::${config_struct}, ${element}>::ops();
}

}  // namespace coda::ops::${ns}
")
        list(APPEND sources ${dir}/${getter}.cu)
        if(dtype STREQUAL "bf16" AND DEFINED spill_bytes_${config})
          set_property(GLOBAL APPEND PROPERTY CODA_SPILL_ACCEPTED "${dir}/${getter}.cu|${spill_bytes_${config}}")
        endif()
      endforeach()
    endforeach()

    # The tile policy.
    if("${default}" STREQUAL "")
      if(NOT "${rule}" STREQUAL "")
        _coda_registry_error(${op} "${alias} has a RULE but no DEFAULT")
      endif()
      continue()
    endif()
    _coda_expect_words(${op} "${default}" 3 "${bf16}"
                       "DEFAULT takes a config ${alias} compiles for bf16, a raster and a swizzle")
    list(GET default 0 default_config)
    list(GET default 1 default_raster)
    list(GET default 2 default_swizzle)
    _coda_knobs(default_knobs ${op} ${default_raster} ${default_swizzle})
    if("${table_bf16}" STREQUAL "")
      if(NOT k EQUAL 0)
        _coda_registry_error(${op} "a pinnable KERNEL after an unpinnable one (the first sets the op's configs)")
      endif()
      set(table_bf16 "${bf16}")
      set(table_fp16 "${fp16}")
      set(chooser choose)
    else()
      set(chooser choose_${tag})
      if(NOT "${bf16}" STREQUAL "${table_bf16}")
        _coda_registry_error(${op} "${alias}'s BF16 list differs from the first KERNEL's (a pin names one list)")
      endif()
    endif()
    list(LENGTH fp16 count)
    if(count GREATER 1)
      _coda_registry_error(${op} "a pinnable ${alias} compiles at most one FP16 config")
    endif()
    list(FIND bf16 ${default_config} fallback)
    set(listed "")
    foreach(config IN LISTS bf16)
      list(APPEND listed "&${getter_bf16_${config}}()")
    endforeach()
    list(JOIN listed ", " listed)
    set(fp16_kernel "static_cast<gemm::KernelOps<${args}> const*>(nullptr)")
    set(fp16_note "bf16 only")
    if(NOT "${fp16}" STREQUAL "")
      set(fp16_kernel "&${getter_fp16_${fp16}}()")
      set(fp16_note "fp16: ${fp16}")
    endif()
    set(body "")
    list(LENGTH rule count)
    set(i 0)
    while(i LESS count)
      math(EXPR i1 "${i} + 1")
      math(EXPR i2 "${i} + 2")
      math(EXPR i3 "${i} + 3")
      math(EXPR i4 "${i} + 4")
      list(GET rule ${i} condition)
      list(GET rule ${i1} config)
      list(GET rule ${i2} raster)
      list(GET rule ${i3} swizzle)
      list(GET rule ${i4} why)
      if(NOT config IN_LIST bf16)
        _coda_registry_error(${op} "RULE \"${condition}\" picks ${config}, which ${alias} does not compile for bf16")
      endif()
      _coda_knobs(knobs ${op} ${raster} ${swizzle})
      if(config IN_LIST fp16)
        set(kernel "fp16 ? &${getter_fp16_${config}}() : &${getter_bf16_${config}}()")
      else()
        set(condition "!fp16 && (${condition})")
        set(kernel "&${getter_bf16_${config}}()")
      endif()
      string(APPEND body "  // ${why}
  if (${condition}) {
    c.ops = ${kernel};
    c.knobs = gemm::fit_swizzle(c.ops->info, M, N, ${knobs});
    return c;
  }
")
      math(EXPR i "${i} + 5")
    endwhile()
    set(name ${op})
    if(NOT k EQUAL 0)
      set(name ${op}/${tag})
    endif()
    set(has_fp16 true)
    if("${fp16}" STREQUAL "")
      set(has_fp16 false)
    endif()
    set_property(GLOBAL APPEND PROPERTY CODA_FUSED_OP_POLICIES "${name}|${op}|${ns}::${chooser}|${has_fp16}")
    string(APPEND choosers "
/// ${alias}'s kernel and scheduler knobs for an M x N x K problem (op.cmake's tile policy): the kernel
/// CODA_OP_CONFIG pins, else the first RULE that holds, else ${default_config} (${fp16_note}) at raster
/// ${default_raster}, swizzle ${default_swizzle}; an unpinned swizzle is lowered where it would pad the tile grid
/// (gemm::fit_swizzle).
inline KernelChoice<${args}> ${chooser}(bool fp16, [[maybe_unused]] int64_t M, [[maybe_unused]] int64_t N,
    [[maybe_unused]] int64_t K) {
  KernelChoice<${args}> c = choose_kernel<${fallback}>(\"coda_${op}\", fp16,
      {${listed}},
      ${fp16_kernel});
  if (c.pinned) return c;
${body}  c.knobs = gemm::fit_swizzle(c.ops->info, M, N, ${default_knobs});
  return c;
}
")
  endforeach()

  set(includes "#include \"ops/${op}/kernels.hpp\"\n")
  if(NOT "${choosers}" STREQUAL "")
    string(APPEND includes "#include \"ops/op_config.hpp\"\n\n#include <cstdint>\n")
    string(REPLACE ";" "\", \"" quoted "${table_bf16}")
    set(fp16_entry nullptr)
    if(NOT "${table_fp16}" STREQUAL "")
      set(fp16_entry "\"${table_fp16}\"")
    endif()
    set_property(GLOBAL APPEND PROPERTY CODA_FUSED_OP_TABLE "{\"coda_${op}\", ${fp16_entry}, {\"${quoted}\"}},")
  endif()
  file(CONFIGURE OUTPUT ${dir}/instances.hpp @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/ops/${op}/op.cmake: do not edit.
// The compiled kernels of coda_${op} (CUTLASS-free: getters of KernelOps tables) and its tile policy.
#pragma once

${includes}
namespace coda::ops::${ns} {

${declarations}${choosers}
}  // namespace coda::ops::${ns}
")
  set_property(GLOBAL APPEND PROPERTY CODA_KERNEL_INSTANCES ${sources})
endfunction()

# The table of the pinnable ops and their policies by name.
function(_coda_fused_op_tables)
  get_property(rows GLOBAL PROPERTY CODA_FUSED_OP_TABLE)
  set(most 0)
  set(text "")
  foreach(row IN LISTS rows)
    string(REGEX MATCH "{(\"[^}]*)}" list "${row}")  # the bf16 list
    string(REGEX MATCHALL "\"[^\"]+\"" names "${CMAKE_MATCH_1}")
    list(LENGTH names count)
    if(count GREATER most)
      set(most ${count})
    endif()
    string(APPEND text "    ${row}\n")
  endforeach()
  file(CONFIGURE OUTPUT ${CODA_GENERATED_DIR}/ops/fused_ops_table.hpp @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/ops/*/op.cmake: do not edit.
// The fused ops CODA_OP_CONFIG can pin (C ABI names), the config each compiles for fp16 (at most one) and the
// configs each compiles for bf16, in the order of its choose() list.
#pragma once

namespace coda::ops::registry {

inline constexpr int kMaxConfigs = ${most};  // the most any op compiles for bf16
struct FusedOp {
  char const* name;
  char const* fp16;               ///< nullptr: bf16 only
  char const* bf16[kMaxConfigs];  ///< nullptr-padded
};
inline constexpr FusedOp kFusedOps[] = {
${text}};

}  // namespace coda::ops::registry
")
  get_property(policies GLOBAL PROPERTY CODA_FUSED_OP_POLICIES)
  set(policy_ops "")
  set(entries "")
  foreach(policy IN LISTS policies)
    string(REPLACE "|" ";" fields "${policy}")
    list(GET fields 0 name)
    list(GET fields 1 op)
    list(GET fields 2 chooser)
    list(GET fields 3 has_fp16)
    list(APPEND policy_ops ${op})
    string(APPEND entries "    {\"${name}\", ${has_fp16}, [](bool fp16, int64_t M, int64_t N, int64_t K) {
       auto const c = ${chooser}(fp16, M, N, K);
       return Choice{c.ops->info.config, c.knobs};
     }},\n")
  endforeach()
  list(REMOVE_DUPLICATES policy_ops)
  set(includes "")
  foreach(op IN LISTS policy_ops)
    string(APPEND includes "#include \"ops/${op}/instances.hpp\"\n")
  endforeach()
  file(CONFIGURE OUTPUT ${CODA_GENERATED_DIR}/ops/fused_ops_policy.hpp @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/ops/*/op.cmake: do not edit.
// Every pinnable kernel kind's tile policy by name (<op> or <op>/<variant>), for coda_fused_op_choice().
#pragma once

${includes}
#include <cstdint>

namespace coda::ops::registry {

struct Choice {
  char const* config;
  gemm::Knobs knobs;
};
struct Policy {
  char const* name;
  bool has_fp16;  ///< false: a bf16-only kind
  Choice (*choose)(bool fp16, int64_t M, int64_t N, int64_t K);
};
inline Policy const kPolicies[] = {
${entries}};

}  // namespace coda::ops::registry
")
endfunction()

# The plain GEMM's kernels (src/gemm/plain.cmake): coda_plain_gemm(<layout> <out dtype> <alias> <config>...), one
# call per (layout, D element, epilogue kind), in dispatch order. Each config becomes
# generated/gemm/<layout>_bf16_<out>_<config>.cu returning plain::<alias><gemm::config::<Config>, <Layout>, <D>>::ops()
# (the aliases: gemm/plain_instance.hpp); coda_registry_generate() writes their declarations
# (generated/gemm/plain_instances.hpp) and the rows of the table gemm.cu dispatches and tunes from
# (generated/gemm/plain_entries.inc).
function(coda_plain_gemm layout out alias)
  if(NOT layout MATCHES "^(fwd|dgrad|wgrad)$" OR NOT out MATCHES "^(bf16|fp32)$" OR ARGC LESS 4)
    message(FATAL_ERROR "src/gemm/plain.cmake: coda_plain_gemm(fwd|dgrad|wgrad bf16|fp32 <alias> <config>...)")
  endif()
  _coda_config_struct(layout_name ${layout})
  set(layout_type "${layout_name}Layout")
  set(element cutlass::bfloat16_t)
  set(dtype CODA_BF16)
  if(out STREQUAL "fp32")
    set(element float)
    set(dtype CODA_FP32)
  endif()
  set(dir ${CODA_GENERATED_DIR}/gemm)
  foreach(config IN LISTS ARGN)
    _coda_config_struct(config_struct ${config})
    set(getter ${layout}_bf16_${out}_${config})
    file(CONFIGURE OUTPUT ${dir}/${getter}.cu @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/gemm/plain.cmake: do not edit.
// Plain GEMM kernel ${getter}: layout ${layout}, bf16 in, ${out} out, ${alias}, config ${config}.
#include \"gemm/config_name.hpp\"
#include \"gemm/plain_instance.hpp\"

namespace coda::gemm::plain {

static_assert(config::is_named<config::${config_struct}>(\"${config}\"),
              \"src/gemm/plain.cmake: gemm::config::${config_struct} is not named ${config}\");

Ops const& ${getter}() { return ${alias}<config::${config_struct}, ${layout_type}, ${element}>::ops(); }

}  // namespace coda::gemm::plain
")
    set_property(GLOBAL APPEND PROPERTY CODA_KERNEL_INSTANCES ${dir}/${getter}.cu)
    set_property(GLOBAL APPEND PROPERTY CODA_PLAIN_GEMM_ENTRIES "${layout}|${dtype}|${getter}")
  endforeach()
endfunction()

function(_coda_plain_gemm_tables)
  get_property(entries GLOBAL PROPERTY CODA_PLAIN_GEMM_ENTRIES)
  set(declarations "")
  set(rows "")
  foreach(entry IN LISTS entries)
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 0 layout)
    list(GET fields 1 dtype)
    list(GET fields 2 getter)
    _coda_config_struct(layout_name ${layout})
    string(APPEND declarations "Ops const& ${getter}();\n")
    string(APPEND rows "{Layout::k${layout_name}, ${dtype}, &plain::${getter}},\n")
  endforeach()
  file(CONFIGURE OUTPUT ${CODA_GENERATED_DIR}/gemm/plain_instances.hpp @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/gemm/plain.cmake: do not edit.
// The plain GEMM's compiled kernels (CUTLASS-free declarations), in src/gemm/plain.cmake's order.
#pragma once

#include \"gemm/plain_kernels.hpp\"

namespace coda::gemm::plain {

${declarations}
}  // namespace coda::gemm::plain
")
  file(CONFIGURE OUTPUT ${CODA_GENERATED_DIR}/gemm/plain_entries.inc @ONLY CONTENT
"// Generated by src/ops/registry.cmake from src/gemm/plain.cmake: do not edit. The rows of gemm.cu's kEntries.
${rows}")
endfunction()

# After every description (src/ops/*/op.cmake, src/gemm/plain.cmake): the tables, and the list of every generated
# kernel instance.
function(coda_registry_generate)
  _coda_fused_op_tables()
  _coda_plain_gemm_tables()
  get_property(sources GLOBAL PROPERTY CODA_KERNEL_INSTANCES)
  list(JOIN sources "\n" lines)
  file(CONFIGURE OUTPUT ${CODA_GENERATED_DIR}/kernel_sources.txt @ONLY CONTENT "${lines}\n")
endfunction()
