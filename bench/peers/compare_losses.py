#!/usr/bin/env python3
"""Compares the per-step losses of training runs (`distflash train --json` output) with a
reference run of the same model, data and hyperparameters:

    python3 bench/peers/compare_losses.py REFERENCE.jsonl OTHER.jsonl [OTHER.jsonl ...]

Each other run must take as many steps, stay within TOLERANCE relative difference of the
reference over the first COMPARED steps (bf16 noise between runs that split the work
differently; later, training amplifies such differences and the curves drift apart while both
still fall) and end below where it started. Prints one line per run and PASSED/FAILED; exits non-zero on a failure.
"""
import json
import sys
from pathlib import Path

TOLERANCE = 2e-2
COMPARED = 10


def losses(path):
    lines = [json.loads(l) for l in Path(path).read_text().splitlines() if l.startswith("{")]
    return [l["loss"] for l in lines if "step" in l]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ref = losses(sys.argv[1])
    ok = len(ref) > 0 and ref[-1] < ref[0]
    print(f"{sys.argv[1]}: {len(ref)} steps, loss {ref[0]:.4f} -> {ref[-1]:.4f}" if ref
          else f"{sys.argv[1]}: no steps")
    for path in sys.argv[2:]:
        run = losses(path)
        pairs = list(zip(ref, run))[:COMPARED]
        diff = max((abs(a - b) / abs(a) for a, b in pairs), default=float("inf"))
        good = len(run) == len(ref) and diff <= TOLERANCE and run[-1] < run[0]
        ok &= good
        end = f"{run[0]:.4f} -> {run[-1]:.4f}" if run else "no steps"
        print(f"{path}: {len(run)} steps, loss {end}, max relative difference over the "
              f"first {COMPARED} steps {diff:.2e}: {'PASS' if good else 'FAIL'}")
    print("PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
