"""The markdown table of hf_parity.py reports: one row per run of each JSON file given.
    python3 bench/peers/parity_table.py bench/results/startup-offload-parity-2026-12-01/call4/parity/hf_parity*.json
"""
import json
import os
import sys

print("| config | device | workers | checkpoint | loss rel. error | worst gradient rel. error | worst tensor | bound | passed |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for path in sys.argv[1:]:
    d = json.load(open(path))
    name = os.path.basename(path)[len("hf_parity_"):-len(".json")].replace("cuda_", "")
    if d["device"] == "cpu":
        bound = str(d["tolerance"])
    else:
        theirs = d["transformers_bf16_max_gradient_relative_error"]
        bound = "%.3g (2x transformers' bf16 %.3g)" % (2 * theirs, theirs)
    for r in d["runs"]:
        print("| %s | %s | %s | %s | %.2e | %.2e | `%s` | %s | %s |" % (
            name, d["device"], r["workers"], r["checkpoint"], r["loss_relative_error"],
            r["max_gradient_relative_error"], r["worst_tensor"], bound, r["passed"]))
