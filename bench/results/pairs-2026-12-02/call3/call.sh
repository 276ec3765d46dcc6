#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: the same .dev/ as call 2. The model's attention
# and the count against the pool, on the head-by-head CTA order.
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache; for t in gpu_model_attention gpu_ops; do LOG=$OUT/$t.log TESTS=$t TIMEOUT=200 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "$t: exit $?"; grep -h "passed: worst\|test result\|FAIL\|panicked" $OUT/$t.log | tail -n 6; done
