"""A model of v35's barrier protocol (kernels/forward_wgmma.cu on branch persistent-fwd), run on
random interleavings: one loading thread and two computing warpgroups of one CTA, its works of
random lengths (0 included; fwd_state's skipped ones too), the Q buffers, the K and V rings and
their mbarriers with the hardware's parity-only waits. No GPU needed:
    python3 protocol_model.py [trials]
It fails (AssertionError) on a deadlock, on a wait that could read a phase two ahead (parity
alone would then be wrong), on a product reading a buffer that holds another tile than its own,
or on staged O overwritten before it was written out. It models the design, not the code: it
says the protocol is sound, not that the kernel implements it."""
import random
import sys


class Bar:
    """An mbarrier: `count` arrivals and any expected transaction bytes complete a phase."""

    def __init__(self, name, count):
        self.name, self.count, self.arrived, self.tx, self.phase = name, count, 0, 0, 0

    def arrive(self, tx=0):
        self.arrived += 1
        self.tx += tx
        self._maybe_complete()

    def complete_tx(self, tx):
        self.tx -= tx
        self._maybe_complete()

    def _maybe_complete(self):
        if self.arrived == self.count and self.tx == 0:
            self.phase += 1
            self.arrived = 0

    def ready(self, n):
        """Whether a wait for the n-th phase (parity n & 1) passes now."""
        assert self.phase <= n + 1, f"{self.name}: waiting for phase {n} at {self.phase}: parity ambiguous"
        return (self.phase & 1) != (n & 1)


stats = {"tiles": 0}


def run(seed, QB):
    rnd = random.Random(seed)
    state = rnd.random() < 0.5  # fwd_state: works that see no key are skipped
    works = [rnd.choice([0, 1, 1, 2, 3, 5]) for _ in range(rnd.randint(1, 7))]
    barQ = [Bar(f"barQ{i}", 1) for i in range(QB)]
    barK = [Bar(f"barK{i}", 1) for i in range(2)]
    barV = [Bar(f"barV{i}", 1) for i in range(3)]
    freeQ = [Bar(f"freeQ{i}", 2) for i in range(QB)]
    freeK = [Bar(f"freeK{i}", 2) for i in range(2)]
    freeV = [Bar(f"freeV{i}", 2) for i in range(3)]
    qbuf = [None] * QB  # what each Q load put in a buffer: ("Q", work)
    kst, vst = [None] * 2, [None] * 3
    slot = [None] * QB  # the work index handed over with each Q buffer
    inflight = []  # TMA loads not landed: (buffer list, index, content, barrier, bytes)

    def loader():
        i = c = 0
        for w in list(range(len(works))) + [None]:
            n = works[w] if w is not None else 0
            if w is not None and state and n == 0:
                continue

            def load_kv(t):
                nonlocal c
                if c >= 2:
                    while not freeK[c % 2].ready((c - 2) // 2):
                        yield
                barK[c % 2].arrive(tx=1)
                inflight.append((kst, c % 2, ("K", c), barK[c % 2], 1))
                if c >= 3:
                    while not freeV[c % 3].ready((c - 3) // 3):
                        yield
                barV[c % 3].arrive(tx=1)
                inflight.append((vst, c % 3, ("V", c), barV[c % 3], 1))
                c += 1

            if n > 0:
                yield from load_kv(0)
            if i >= QB:
                while not freeQ[i % QB].ready((i - QB) // QB):
                    yield
            slot[i % QB] = w if w is not None else -1
            if n > 0:
                barQ[i % QB].arrive(tx=1)
                inflight.append((qbuf, i % QB, ("Q", w), barQ[i % QB], 1))
            else:
                barQ[i % QB].arrive()
            i += 1
            if w is None:
                return
            for t in range(1, n):
                yield from load_kv(t)

    turn = [0]  # whose ping-pong turn it is

    def consumer(wg):
        i = c = 0
        while True:
            while not barQ[i % QB].ready(i // QB):
                yield
            w = slot[i % QB]
            if w == -1:
                return
            n = works[w]
            for j in range(n):
                cn = c + j
                while not barK[cn % 2].ready(cn // 2):
                    yield
                if j > 0:
                    while not barV[(cn - 1) % 3].ready((cn - 1) // 3):
                        yield
                while turn[0] != wg:
                    yield
                assert qbuf_rows[(i % QB, wg)] == ("Q", w), (seed, "Q", qbuf_rows[(i % QB, wg)], w)
                assert kst[cn % 2] == ("K", cn), (seed, "K", kst[cn % 2], cn)
                if j > 0:
                    assert vst[(cn - 1) % 3] == ("V", cn - 1), (seed, "V", cn - 1)
                turn[0] = 1 - wg
                yield
                freeK[cn % 2].arrive()
                yield
                if j > 0:
                    freeV[(cn - 1) % 3].arrive()
            if n > 0:  # the last tile's P·V, outside the turns
                cn = c + n - 1
                while not barV[cn % 3].ready(cn // 3):
                    yield
                assert vst[cn % 3] == ("V", cn), (seed, "last V", cn)
                yield
                freeV[cn % 3].arrive()
            c += n
            stats["tiles"] += n
            # O staged over this warpgroup's rows of the Q buffer, then written out.
            qbuf_rows[(i % QB, wg)] = ("O", wg, w)
            yield
            assert qbuf_rows[(i % QB, wg)] == ("O", wg, w), (seed, "O overwritten", w)
            freeQ[i % QB].arrive()
            i += 1

    qbuf_rows = {}  # what each warpgroup's rows of a Q buffer hold: ("Q", work) or ("O", wg, work)
    threads = [loader(), consumer(0), consumer(1)]
    live = [True, True, True]
    idle = 0
    while any(live):
        k = rnd.randrange(3 + 1)
        if k == 3:  # a TMA load lands
            if inflight:
                buf, idx, content, bar, tx = inflight.pop(rnd.randrange(len(inflight)))
                buf[idx] = content
                if buf is qbuf:  # a Q load overwrites both warpgroups' staged rows
                    qbuf_rows[(idx, 0)] = qbuf_rows[(idx, 1)] = content
                bar.complete_tx(tx)
                idle = 0
            continue
        if not live[k]:
            continue
        phase_before = [b.phase for b in barQ + barK + barV + freeQ + freeK + freeV]
        try:
            next(threads[k])
        except StopIteration:
            live[k] = False
        progressed = phase_before != [b.phase for b in barQ + barK + barV + freeQ + freeK + freeV]
        idle = 0 if progressed else idle + 1
        assert idle < 10000 or inflight, f"seed {seed}: deadlock (works {works}, QB {QB})"
    assert not inflight, "loads left in flight"
    return len(works)


if __name__ == "__main__":
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for qb in (1, 2):
        for seed in range(trials):
            run(seed, qb)
    print(f"{trials} random interleavings at each of 1 and 2 Q buffers ({stats['tiles']} tiles "
          "computed): no deadlock, no stale read")
