"""How evenly a forward's works spread over 132 SMs, by schedule (no GPU needed):
    python3 sched_sim.py
Works are (head, query tile) in the kernels' order (cta_work / work_at, kernels/common.cuh:
heads in groups that fill the SMs, heaviest tiles first), each costing its visible key tiles
(causal, 128-row tiles) plus FIXED tiles. Printed: the busiest SM's total over the mean.
greedy = each work to the SM free first (CTAs started by the hardware, or a persistent kernel
taking works from an atomic counter); rr = work i to SM i % 132 (static); snake = rr
reversed every other round."""
import heapq

SMS, FIXED = 132, 1.5


def works(seq, heads, bq=128):
    tiles = seq // bq
    group = max(1, SMS // tiles)
    out = []
    for i in range(heads * tiles):
        g, r = divmod(i, group * tiles)
        width = min(group, heads - g * group)
        out.append(tiles - r // width)  # tile tiles-1-t sees tiles-t key tiles
    return out


def greedy(w):
    h = [0.0] * SMS
    for x in w:
        heapq.heappush(h, heapq.heappop(h) + x + FIXED)
    return max(h)


def static(w, snake):
    s = [0.0] * SMS
    for i, x in enumerate(w):
        m, k = divmod(i, SMS)
        s[SMS - 1 - k if snake and m % 2 else k] += x + FIXED
    return max(s)


for heads in (32, 8):
    for seq in (4096, 8192, 16384, 32768, 131072):
        w = works(seq, heads)
        mean = (sum(w) + FIXED * len(w)) / SMS
        print(f"heads {heads:3} seq {seq:6}: greedy {greedy(w) / mean:.3f}  "
              f"rr {static(w, False) / mean:.3f}  snake {static(w, True) / mean:.3f}")
