# The registry's refusals (src/ops/registry.cmake): each malformed coda_fused_op() description below must stop the
# configure step with its error, and a well-formed one must generate its instances and choose(). Script mode:
#   cmake -DREGISTRY=<src/ops/registry.cmake> -DWORK=<scratch folder> -P registry_cases.cmake
# (the ctest Registry.Descriptions).
cmake_minimum_required(VERSION 3.25)
if(NOT REGISTRY OR NOT WORK)
  message(FATAL_ERROR "usage: cmake -DREGISTRY=<registry.cmake> -DWORK=<dir> -P registry_cases.cmake")
endif()

set(pp pp_128x128x64_c2x1)
set(coop coop_128x256x64_c2x1)
# name, description (after "coda_fused_op(t ARGS TArgs NAMESPACE t_kernels LAYOUT fwd"), the error expected
set(cases
  no_kernel "" "at least one KERNEL"
  no_variant "KERNEL A BF16 ${pp} KERNEL B BF16 ${pp}" "needs a VARIANT"
  variant_twice "KERNEL A BF16 ${pp} KERNEL B VARIANT v BF16 ${pp} KERNEL C VARIANT v BF16 ${pp}" "VARIANT v twice"
  two_aliases "KERNEL A B BF16 ${pp}" "KERNEL takes one word"
  config_twice "KERNEL A BF16 ${pp} ${pp}" "BF16 lists ${pp} twice"
  rule_short "KERNEL A BF16 ${pp} FP16 ${pp} DEFAULT ${pp} n 8 RULE \"K > 1\" ${pp} n \"why\"" "got 4 words"
  rule_long "KERNEL A BF16 ${pp} FP16 ${pp} DEFAULT ${pp} n 8 RULE \"K > 1\" ${pp} n 8 8 \"why\"" "got 6 words"
  rule_no_default "KERNEL A BF16 ${pp} RULE \"K > 1\" ${pp} n 8 \"why\"" "has a RULE but no DEFAULT"
  rule_config "KERNEL A BF16 ${pp} FP16 ${pp} DEFAULT ${pp} n 8 RULE \"K > 1\" ${coop} n 8 \"why\"" "does not compile"
  default_config "KERNEL A BF16 ${pp} FP16 ${pp} DEFAULT ${coop} n 8" "DEFAULT takes a config"
  bad_raster "KERNEL A BF16 ${pp} FP16 ${pp} DEFAULT ${pp} x 8" "raster must be"
  bad_swizzle "KERNEL A BF16 ${pp} FP16 ${pp} DEFAULT ${pp} n 3" "swizzle must be"
  spill_config "KERNEL A BF16 ${pp} ACCEPT_SPILL ${coop} 12" "ACCEPT_SPILL takes a config"
  spill_bytes "KERNEL A BF16 ${pp} ACCEPT_SPILL ${pp} lots" "must be a number"
  spill_odd "KERNEL A BF16 ${pp} ${coop} ACCEPT_SPILL ${pp} 12 ${coop}" "ACCEPT_SPILL takes a config"
  spill_twice "KERNEL A BF16 ${pp} ACCEPT_SPILL ${pp} 12 ACCEPT_SPILL ${pp} 60" "ACCEPT_SPILL names ${pp} twice"
  fp16_list "KERNEL A BF16 ${pp} FP16 ${pp} ${coop} DEFAULT ${pp} n 8" "at most one FP16 config"
  variant_list "KERNEL A BF16 ${pp} ${coop} FP16 ${pp} DEFAULT ${pp} n 8
                KERNEL B VARIANT v BF16 ${pp} FP16 ${pp} DEFAULT ${pp} n 8" "differs from the first"
  key_after_kernel "KERNEL A BF16 ${pp} ARGS Other" "ARGS after the first KERNEL"
  good "KERNEL A BF16 ${coop} ${pp} FP16 ${pp} ACCEPT_SPILL ${coop} 12 ACCEPT_SPILL ${pp} 60 DEFAULT ${pp} n 8
        RULE \"K >= 8192\" ${coop} n 8 \"long K\"" "")

list(LENGTH cases count)
set(failures "")
set(i 0)
while(i LESS count)
  math(EXPR j "${i} + 1")
  math(EXPR k "${i} + 2")
  list(GET cases ${i} name)
  list(GET cases ${j} body)
  list(GET cases ${k} expect)
  set(dir ${WORK}/${name})
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${dir}/case.cmake "cmake_minimum_required(VERSION 3.25)\ninclude(${REGISTRY})\n"
                               "coda_fused_op(t ARGS TArgs NAMESPACE t_kernels LAYOUT fwd ${body})\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -P ${dir}/case.cmake WORKING_DIRECTORY ${dir}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE "\n" " " err "${err}")
  string(REGEX REPLACE " +" " " err "${err}")
  if(expect STREQUAL "")
    set(header ${dir}/generated/ops/t/instances.hpp)
    if(NOT rc EQUAL 0 OR NOT EXISTS ${header} OR NOT EXISTS ${dir}/generated/ops/t/fwd_bf16_${coop}.cu)
      list(APPEND failures "${name}: expected success, got rc=${rc}: ${err}")
    else()
      file(READ ${header} text)
      if(NOT text MATCHES "if \\(!fp16 && \\(K >= 8192\\)\\)" OR NOT text MATCHES "c.knobs = gemm::fit_swizzle\\(c.ops->info, M, N, raster_n\\(8\\)\\);")
        list(APPEND failures "${name}: instances.hpp lacks the RULE's bf16-only condition or the knobs")
      endif()
    endif()
  elseif(rc EQUAL 0 OR NOT err MATCHES "${expect}")
    list(APPEND failures "${name}: expected an error with '${expect}', got rc=${rc}: ${err}")
  endif()
  math(EXPR i "${i} + 3")
endwhile()
math(EXPR n "${count} / 3")
if(failures)
  list(JOIN failures "\n" text)
  message(FATAL_ERROR "registry: ${text}")
endif()
message(STATUS "registry: ${n} descriptions behaved as expected")
