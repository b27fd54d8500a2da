set -u
CODA_COMMIT=7ca008c CODA_BUILD_DIR=.stage timeout 500 tools/gpu-check --sanitize --filter 'Fused*:LinearCrossEntropy*' --bench full --benches bench_fused --bench-args --sweep 2>&1 | grep -v "^  sweep" | tail -32
grep -E "Failure|FAILED" $OUT/gpu_tests.log | head -20
