set -u
# The session's last device time (about 150 s): gpu_ops (the norm's one-pass backward and the
# shared f32-copy master), the step at 16K before (07743c4) and after, the ops alone, then the
# parity check and the MLP-blocks experiment while time is left.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p $OUT/checks
TESTS=gpu_ops LOG=$OUT/checks/gpu_tests.log TIMEOUT=100 bash bench/peers/gpu_tests.sh
echo "PASS lines: $(grep -c PASS $OUT/checks/gpu_tests.log)"; grep -h "FAIL\|test result" $OUT/checks/gpu_tests.log | head -8
grep -h "rmsnorm_backward\|master" $OUT/checks/gpu_tests.log | cut -c1-110 | head -24
echo "gpu_ops done at $SECONDS s"
source bench/results/norm-one-pass-2026-12-06/h100/common_ab.sh
ab prev .dev/prev/distflash 16384; ab new .dev/distflash 16384
ab_report; echo "A/B done at $SECONDS s"
timeout 45 .dev/gpu_timing ops --rows 16384 > $OUT/ops16384.log 2>&1; cat $OUT/ops16384.log
echo "ops done at $SECONDS s"
ab mlpwhole .dev/mlpwhole/distflash 16384; ab new .dev/distflash 16384; ab_report | tail -2
echo "mlpwhole done at $SECONDS s"
python3 bench/peers/hf_parity.py --bin .dev/distflash --out /tmp/parity --device cuda > $OUT/checks/parity.log 2>&1; tail -3 $OUT/checks/parity.log
echo "done at $SECONDS s"
