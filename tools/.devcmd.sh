set -u
CODA_COMMIT=caa1f25 CODA_BUILD_DIR=.stage timeout 300 tools/gpu-check --no-tests --sanitize --bench full --benches bench_fused --bench-args --sweep 2>&1 | grep -v "^  sweep" | tail -34
export LD_LIBRARY_PATH=$PWD/.stage/src:/usr/local/cuda/lib64
timeout 170 .stage/tests/coda_gpu_tests --gtest_filter='LinearCrossEntropy.Llama3Vocab' > $OUT/ce_vocab.log 2>&1; echo "ce vocab rc=$?"; grep -E "OK|FAIL|Failure|loss|lse" $OUT/ce_vocab.log | head
