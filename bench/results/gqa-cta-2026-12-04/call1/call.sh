#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Builds:
#   v31 = .dev/v31/ (main ceab480; gpu_timing only)
#   v33 = .dev/     v31 plus: a wgmma backward CTA takes several query heads of one KV head in
#                   turn (TileWalk/BwdCta in backward_wgmma.cuh; head_group from the host's
#                   launch::backward_heads_per_cta: the most heads of a GQA group that leave two
#                   waves of CTAs, e.g. 4 of 32/8 from 8K, 2 at 4K; one for MHA and in the
#                   deterministic mode), its dK and dV summed over them in registers and added
#                   into the f32 accumulators once; the computing warpgroups read each tile's
#                   first row from shared memory (staged by the loading warp). Both wgmma
#                   backward kernels. SASS of the d128 causal loop: 777 -> 787 instructions, no
#                   spill. `bwd-heads-per-cta=1` in DISTFLASH_TUNING runs v33 one head a CTA.
# Prediction, written before the call: GQA 32/8 d128 backward, 4 heads a CTA against one (same
# build): +6-8% at 8K (the CTA's fixed cost, ~6 query tiles of ~65 at 8K, paid once for 4 heads;
# a quarter of the f32 reductions), +3-4% at 16K, +1.5-2% at 32K, ~+0.5% at 128K; 4K (2 heads a
# CTA) +3%. MHA d128 (one head a CTA) against v31: level to -1% (the loop's 10 more
# instructions). GQA d256 (wide kernel, 64-key CTAs), 8K +4%, 32K +1%.
# 1. the new GPU test (heads sharing a CTA, every GQA/MQA case, each head dim, masks) and the
#    fast path; the deterministic repeats (their kernel changed by the walk, folded to one head);
# 2. gpu_timing attention alternated twice: MHA d128 v31 / v33; GQA 32/8 d128 v33 one head a
#    CTA / v33 default; GQA 32/8 d256 likewise (4K-128K for d128, 8K and 32K for d256).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
LOG=$R/gpu_attention.log TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh heads_sharing fast_path_matches > /dev/null 2>&1; echo "gpu_attention heads_sharing, fast_path: exit $?"
grep -h "test result\|FAIL\|panicked\|passed: worst" $R/gpu_attention.log | tail -n 6
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=120 bash bench/peers/gpu_tests.sh repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det repeats: exit $?"
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('%dK bwd %.0f fwd %.0f;' % (r['seq']//1024, r['bwd_tflops'], r['fwd_tflops']), end=' ')" 2>&1; echo; }
S=4096,8192,16384,32768,131072
for round in 1 2; do
  for v in v31 v33; do
    b=.dev/gpu_timing; [ $v = v31 ] && b=.dev/v31/gpu_timing
    timeout 100 $b attention --seqs $S --head-dims 128 --json $R/mha_${v}_$round.jsonl > /dev/null 2>$R/mha_${v}_$round.err
    echo "MHA d128 $v round $round: exit $? $(sum $R/mha_${v}_$round.jsonl)"
  done
  for h in one auto; do
    t=; [ $h = one ] && t=bwd-heads-per-cta=1
    DISTFLASH_TUNING=$t timeout 100 .dev/gpu_timing attention --seqs $S --head-dims 128 --kv-heads 8 --json $R/gqa_${h}_$round.jsonl > /dev/null 2>$R/gqa_${h}_$round.err
    echo "GQA d128 v33 $h round $round: exit $? $(sum $R/gqa_${h}_$round.jsonl)"
  done
  for h in one auto; do
    # (the rest of Tuning::for_head_dim(256) named: DISTFLASH_TUNING starts from 128's)
    t=; [ $h = one ] && t=bwd-heads-per-cta=1,fwd-mtiles=1,bwd-key-split=4
    DISTFLASH_TUNING=$t timeout 100 .dev/gpu_timing attention --seqs 8192,32768 --head-dims 256 --kv-heads 8 --json $R/gqa256_${h}_$round.jsonl > /dev/null 2>$R/gqa256_${h}_$round.err
    echo "GQA d256 v33 $h round $round: exit $? $(sum $R/gqa256_${h}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R
