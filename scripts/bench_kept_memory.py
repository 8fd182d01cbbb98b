"""Repeated CPU adjoint calls with and without the memory they keep (kadj.call_memory).

For every CPU gallery kernel whose adjoint allocates (tapes, work copies, scratch
arrays): the forward's time, the compiled adjoint's with every array new memory at each
call (``fresh_memory()``, as before kept memory) and with the memory a previous call
kept (a set of the adjoint's, used before: its pages are mapped), at ``--size`` through the
example's ``sized`` maker (a tenth of it while one forward run takes over 50 ms), one
numba thread, CPU time of this process (page faults are counted: they are system time),
each the median of ``--repeat`` calls taken in turn, arguments copied outside the
timing.  Prints one row per kernel: the kept bytes, the three times, adjoint/forward
both ways and the speed-up.

    NUMBA_NUM_THREADS=1 python scripts/bench_kept_memory.py [--size 1000000] [--repeat 7]
        [--only NAME ...] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gallery_doc import _copy, _sized, _time  # noqa: E402  (one sizing and timing rule)


def rows(size, repeat, only=None):
    import numba

    import kadj
    from kernels.cpu import GALLERY

    numba.set_num_threads(1)
    out = []
    for ex in GALLERY:
        if (only and ex.name not in only) or ex.sized is None:
            continue
        k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
        small = ex.make_args(np.random.default_rng(0))
        ex.kernel(*_copy(small))
        comp = k.compiled(*small)
        if comp.memory is None:
            continue
        n, args = _sized(ex, size, 0.05)
        plan = k.adjoint_plan(*args)
        adjs = [np.zeros_like(args[i]) if isinstance(args[i], np.ndarray)
                else np.zeros(1, np.asarray(args[i]).dtype) for i in plan.adjoint_args]

        def adj_args():
            return _copy(args) + tuple(a.copy() for a in adjs)
        comp = k.compiled(*args)
        pool = comp.memory
        for _ in range(2):                      # compiles; sizes the kept set, maps it
            k.adjoint(*adj_args())
        kept = pool.take()
        ret = (1.0,) if plan.returns_value else ()      # adj_return

        def fresh():
            return tuple(comp.fresh_memory())
        times = {"forward": [], "fresh": [], "kept": []}
        for _ in range(repeat):
            times["forward"].append(_time(ex.kernel, _copy(args)))
            times["fresh"].append(_time(comp.function, adj_args() + ret + fresh()))
            times["kept"].append(_time(comp.function, adj_args() + ret + tuple(kept.args)))
        kept_bytes = int(kept.caps.sum())
        pool.give(kept)
        med = {key: statistics.median(v) for key, v in times.items()}
        row = dict(kernel=ex.name, size=n, kept_mb=kept_bytes / 1e6,
                   forward_ms=med["forward"] * 1e3, fresh_ms=med["fresh"] * 1e3,
                   kept_ms=med["kept"] * 1e3)
        out.append(row)
        print(f"{ex.name:24s} {n:>8d} {row['kept_mb']:8.1f} {row['forward_ms']:9.2f} "
              f"{row['fresh_ms']:9.2f} {row['kept_ms']:9.2f} "
              f"{med['fresh'] / med['forward']:8.1f} {med['kept'] / med['forward']:8.1f} "
              f"{med['fresh'] / med['kept']:7.2f}x", flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--only", nargs="+", metavar="NAME")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    print(f"{'kernel':24s} {'size':>8s} {'kept MB':>8s} {'fwd ms':>9s} {'fresh ms':>9s} "
          f"{'kept ms':>9s} {'fresh/f':>8s} {'kept/f':>8s} {'speedup':>8s}")
    out = rows(a.size, a.repeat, set(a.only) if a.only else None)
    if out:
        print(f"median speed-up {statistics.median(r['fresh_ms'] / r['kept_ms'] for r in out):.2f}x "
              f"over {len(out)} kernels")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
