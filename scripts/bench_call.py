"""Print the call overhead benchmarks of ``perf/bench_call.py`` as one table.

10,000 launches (``--launches``) of a tiny 1-D (8 elements) and 2-D (8 x 8) stencil:
per-call microseconds of the forward ``k(...)`` and of the numba dispatcher called
directly, of ``k.adjoint(...)`` (every argument check included) and of the compiled
adjoint called directly, and kadj's overhead (the differences); best of ``--repeat``
runs.

Usage::

    python scripts/bench_call.py
    python scripts/bench_call.py --launches 100000 --repeat 10
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: perf/ and kadj/ live next to scripts/
    sys.path.insert(0, str(ROOT))

from perf import bench_call as bench  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=bench.LAUNCHES)
    p.add_argument("--repeat", type=int, default=bench.ROUNDS)
    args = p.parse_args(argv)
    print(f"Per-call time, {args.launches:,} launches, best of {args.repeat} (us)\n")
    print("| kernel | forward `k(...)` | numba dispatcher | kadj forward overhead | "
          "`k.adjoint(...)` | compiled adjoint | kadj adjoint overhead |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case in bench.CASES:
        t = bench.measure(case, args.launches, args.repeat)
        print(f"| {case} | {t['forward']:.2f} | {t['dispatcher']:.2f} | "
              f"{t['forward'] - t['dispatcher']:.2f} | {t['adjoint']:.2f} | "
              f"{t['compiled adjoint']:.2f} | "
              f"{t['adjoint'] - t['compiled adjoint']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
