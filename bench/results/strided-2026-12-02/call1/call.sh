#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/ of main at the strided kernels + hfmask merge
# (build_gpu_tests.sh, build_wheel.sh).
# 1. GPU tests: gpu_attention (head-major fast path, the new sequence-major fast path, the lent
#    path in torch's [b, s, h, d] strides, the block API and ranks), gpu_model_attention (the
#    model's attention reading its tensors in place), gpu_ops (the count against the pool).
# 2. bench attention, sequence-major (the new default) then head-major, d128 and d64.
# 3. The binding: torch_binding.sh (correctness vs SDPA, views bit for bit, speed vs the binary,
#    transformers LLaMA, errors; dist_flash_attn) and hf_mask_parity.sh (the helper's masks).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
for t in gpu_attention gpu_model_attention gpu_ops; do
  LOG=$OUT/$t.log TESTS=$t TIMEOUT=170 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "$t: exit $?"
  grep -h "passed: worst\|test result\|FAIL\|panicked" $OUT/$t.log | tail -n 8
done
for layout in seq-major head-major; do
  timeout 60 .dev/distflash bench attention --device cuda --seqs 4096,16384,65536 --head-dims 128,64 --layout $layout --json $OUT/attention_$layout.jsonl > /dev/null 2>&1; echo "attention $layout: exit $?"
done
python3 - $OUT/attention_seq-major.jsonl $OUT/attention_head-major.jsonl <<'PY'
import json, sys
rows = [{(r["seq"], r["head_dim"]): r for r in map(json.loads, open(f))} for f in sys.argv[1:]]
for key in sorted(rows[0]):
    s, h = rows[0][key], rows[1].get(key)
    if h: print(key, "seq-major/head-major fwd %.3f bwd %.3f; seq-major fwd %.0f bwd %.0f TFLOP/s" % (
        s["fwd_ms"] / h["fwd_ms"], s["bwd_ms"] / h["bwd_ms"], s["fwd_tflops"], s["bwd_tflops"]))
PY
SEQS=4096,16384,65536 DIMS=128,64 timeout 200 bash bench/peers/torch_binding.sh > $OUT/torch_binding.log 2>&1; echo "torch_binding: exit $?"
grep -h "PASSED\|FAILED\|example:" $OUT/torch_binding.log | tail -n 4
python3 - $OUT/torch_binding.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for row in r.get("speed", []):
    if isinstance(row, dict) and "seq" in row:
        print("speed", row["seq"], row["head_dim"], "bshd/binary %.3f head-major/binary %.3f" % (row["bshd_over_binary"], row["head_major_over_binary"]))
print("views", [row.get("passed") for row in r.get("views", []) if isinstance(row, dict)], r.get("views_passed"))
print({k: v for k, v in r.items() if k.endswith("passed")})
PY
timeout 120 bash bench/peers/hf_mask_parity.sh > $OUT/hf_mask_parity.log 2>&1; echo "hf_mask_parity: exit $?"; tail -n 2 $OUT/hf_mask_parity.log
