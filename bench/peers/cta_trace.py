#!/usr/bin/env python3
"""Summarises a per-CTA clock trace of the backward kernel: where a CTA's cycles go.

The trace comes from a scratch build (not committed): bench/results/short-bwd-2026-12-04/call1/
trace.patch, applied to main a820dc7, makes thread 0 of each backward CTA read clock64 at entry,
once K and V have landed, after query tile 0, after the last dQ turn and after dK and dV have
been written, and on the module's 4th launch print them as

    TRACE cta sm bh key_tile query_tiles t_entry t_kv t_first t_loop t_end globaltimer

Usage: python3 bench/peers/cta_trace.py trace_8192.txt [trace_32768.txt ...]

Per file it prints the mean cycles of the prologue (entry to K/V landed), the first query tile,
a steady tile (the rest of the loop over its tiles), the epilogue (dK and dV out) and the gap
between consecutive CTAs on one SM, and the fixed cost per CTA in steady tiles. The printing
itself runs at each CTA's end, so the gaps include it; and the traced build ran its loop slower
than the untraced one (call 1's README), so the figures say where the time goes, not how much.
"""
import collections
import statistics as st
import sys


def summarise(path):
    rows = []
    for line in open(path):
        if not line.startswith("TRACE"):
            continue
        f = line.split()[1:]
        sm, tiles = int(f[1]), int(f[4])
        rows.append((sm, tiles, [int(x) for x in f[5:10]]))
    prologue = st.mean(t[1] - t[0] for _, _, t in rows)
    first = st.mean(t[2] - t[1] for _, _, t in rows)
    steady = st.median((t[3] - t[2]) / (n - 1) for _, n, t in rows if n > 2)
    epilogue = st.mean(t[4] - t[3] for _, _, t in rows)
    by_sm = collections.defaultdict(list)
    for sm, _, t in rows:
        by_sm[sm].append(t)
    gaps = []
    for ts in by_sm.values():
        ts.sort()
        gaps += [b[0] - a[4] for a, b in zip(ts, ts[1:])]
    gap = st.median(gaps)
    mean_tiles = st.mean(n for _, n, _ in rows)
    fixed = (prologue + first - steady + epilogue) / steady
    print(
        f"{path}: {len(rows)} CTAs, {mean_tiles:.1f} query tiles each; cycles: prologue "
        f"{prologue:.0f}, first tile {first:.0f}, steady tile {steady:.0f} (median), epilogue "
        f"{epilogue:.0f}, gap between CTAs {gap:.0f} (median, printing included); fixed cost "
        f"per CTA without the gap: {fixed:.2f} steady tiles"
    )


for p in sys.argv[1:]:
    summarise(p)
