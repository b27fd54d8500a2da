set -u
export LD_LIBRARY_PATH=$PWD/.stage/src:/usr/local/cuda/lib64
B=.stage/bench/bench_fused
$B --sweep --out $OUT/sweep.jsonl --commit 82b0ee2 > $OUT/sweep.log 2>&1
tail -40 $OUT/sweep.log
S="--section SpeedOfLight --section LaunchStats --section WarpStateStats --section InstructionStats --section SchedulerStats --section Occupancy"
timeout 120 ncu --clock-control none --kernel-name regex:OnlineLse --launch-count 1 $S $B --ops f5 --models 1B --tokens 8192 --reps 1 --warmup 1 > $OUT/ncu_f5.txt 2>&1
timeout 100 ncu --clock-control none --kernel-name regex:RopeRowscale --launch-count 1 $S $B --ops f4 --models 1B --reps 1 --warmup 1 > $OUT/ncu_f4.txt 2>&1
timeout 100 ncu --clock-control none --kernel-name regex:PairStore --launch-count 1 $S $B --ops f3 --models 8B --reps 1 --warmup 1 > $OUT/ncu_f3.txt 2>&1
grep -E "Duration|Registers|Local|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Thr|Memory Thr|Executed Instructions  " $OUT/ncu_f*.txt
