set -u
# Whatever device time is left (under a minute): the GPU cases of this session's GPU changes.
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/checks
TESTS=gpu_ops LOG=$OUT/checks/gpu_tests.log TIMEOUT=50 bash bench/peers/gpu_tests.sh rmsnorm master
grep -h "PASS\|FAIL\|test result" $OUT/checks/gpu_tests.log | cut -c1-110 | head -40
