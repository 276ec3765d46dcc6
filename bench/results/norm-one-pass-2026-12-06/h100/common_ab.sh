# Sourced by the call scripts: the checks, the A/B of .dev/prev (07743c4) against .dev (d990dc6),
# and the rmsnorm lines of each build's profile.
checks() {
  mkdir -p $OUT/checks
  (time OUT=$OUT/checks bash bench/peers/gpu_train_checks.sh) > $OUT/checks.log 2>&1; tail -4 $OUT/checks.log
  echo "PASS lines: $(grep -c PASS $OUT/checks/gpu_tests.log)"; grep -h "FAIL\|test result" $OUT/checks/gpu_tests.log | head -8
  grep -h "rmsnorm_backward" $OUT/checks/gpu_tests.log | cut -c1-120 | head -20
  grep -h "PASSED\|FAILED\|agree\|worst" $OUT/checks/parity.log $OUT/checks/*.log 2>/dev/null | head -6
}
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
ab() { local tag=$1 b=$2 n=$3
  timeout 150 $b bench train --device cuda --preset llama2-7b --layers 16 --json --optimizer --seq-len $n 2>>$OUT/ab.err | sed "s/^{/{\"build\":\"$tag\",/" >> $OUT/ab.jsonl; }
ab_report() {
python3 -c "
import json
for l in open('$OUT/ab.jsonl'):
    d=json.loads(l); print(d['build'], d['seq'], d.get('whole_layers'), d.get('offload'), round(d['step_secs'],4), d.get('peak_memory_gib'), d.get('estimated_memory_gib'))"
grep -i "error" $OUT/ab.err | head -3
}
profiles() { local n=$1
  for tag in prev new; do b=.dev/distflash; [ $tag = prev ] && b=.dev/prev/distflash
    timeout 120 $b bench train --device cuda --preset llama2-7b --layers 16 --optimizer --seq-len $n --warmup 1 --repeats 2 --profile > $OUT/profile_${tag}_$n.log 2>&1
    echo "$tag $n: $(grep -h '^step\|rmsnorm' $OUT/profile_${tag}_$n.log | tr -s ' ' | tr '\n' ';')"
  done
}
