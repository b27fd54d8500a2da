set -u
export LD_LIBRARY_PATH=$PWD/.stage/src:/usr/local/cuda/lib64
T=.stage/tests/coda_gpu_tests
timeout 60 $T --gtest_filter='FusedLse.Shapes:FusedLse.NodePartials:FusedLse.AllRowsIgnored:FusedLse.BadTargetIsNaN:FusedLse.Vocab32k:LinearCrossEntropy.Options:LinearCrossEntropy.AllRowsIgnored' > $OUT/t.log 2>&1; echo "tests rc=$?"; grep -E "PASSED|FAILED|Failure" $OUT/t.log | head
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 $T --gtest_filter='FusedLseSanitize.*:LinearCrossEntropySanitize.*' > $OUT/san.log 2>&1; echo "sanitizer rc=$?"; grep "ERROR SUMMARY" $OUT/san.log
timeout 100 .stage/bench/bench_fused --ops f1,f5 --sweep --out $OUT/bench_fused.jsonl --commit 9e935ca > $OUT/bench.log 2>&1; echo "bench rc=$?"; grep -v "^  sweep" $OUT/bench.log | tail -14
