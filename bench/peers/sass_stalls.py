#!/usr/bin/env python3
"""Where a kernel's warps wait, from ncu's per-instruction warp-state samples.

Reads the CSV that `ncu --import X.ncu-rep --page source --csv --print-source sass` writes
(gzipped or not) and prints the landmarks of the hot loop (wgmma products, barriers, waits,
fences) in address order, each with the share of all samples that fell on it and on the
instructions since the previous landmark, and the top stall reasons there. Summing consecutive
rows gives the share of a part of the loop (how bench/results/ceiling-2026-12-04's tables were
read). Only instructions executed at least half as often as the most executed wgmma count as the
loop (spin loops of waits included); the rest are summed on one line.

    python3 bench/peers/sass_stalls.py bench/results/ceiling-2026-12-04/call5/runs/bwd_sass.csv.gz

With parts (`LO-HI=name`, addresses as printed, HI excluded), it instead sums every instruction
in each range, executed often or not, with its top stall reasons:

    python3 bench/peers/sass_stalls.py FILE ba820-baa50="take the turn" baa50-bb220="issue S, dP"
"""
import csv
import gzip
import sys
from collections import Counter

LANDMARKS = ("HGMMA", "BAR", "DEPBAR", "SYNCS", "FENCE", "MEMBAR")


def main(path, parts):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def samples(r):
        return int(r[col["Warp Stall Sampling (All Samples)"]] or 0)

    def executed(r):
        return int(r[col["Instructions Executed"]] or 0)

    total = sum(samples(r) for r in data)
    if parts:
        for part in parts:
            span, name = part.split("=", 1)
            lo, hi = (int(x, 16) for x in span.split("-"))
            inside = [r for r in data if lo <= int(r[0], 16) & 0xFFFFF < hi]
            why = Counter()
            for r in inside:
                for h in reasons:
                    why[h[len("stall_"):]] += int(r[col[h]] or 0)
            top = ", ".join(f"{k} {v / total * 100:.1f}" for k, v in why.most_common(3))
            print(f"{sum(samples(r) for r in inside) / total * 100:6.2f}%  {name:40s} {top}")
        return
    hot = max(executed(r) for r in data if "HGMMA" in r[1]) / 2
    print(f"{len(data)} instructions, {total} samples")
    since, why, outside = 0, Counter(), 0
    for r in data:
        if executed(r) < hot:
            outside += samples(r)
            continue
        since += samples(r)
        for h in reasons:
            why[h[len("stall_"):]] += int(r[col[h]] or 0)
        text = r[1].strip()
        if any(k in text for k in LANDMARKS):
            top = ", ".join(f"{k} {v / total * 100:.1f}" for k, v in why.most_common(3))
            print(f"{int(r[0], 16) & 0xFFFFF:05x} {since / total * 100:6.2f}%  {text[:60]:60s} {top}")
            since, why = 0, Counter()
    print(f"after the last landmark: {since / total * 100:.2f}%; outside the loop: "
          f"{outside / total * 100:.2f}%")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
