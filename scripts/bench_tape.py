"""Print the tape benchmarks of ``perf/bench_tape.py`` as two tables, in one run.

1. Per-launch recording and replay cost of a 64-element 1-D stencil, ping-pong
   buffers, at 100 / 1,000 / 5,000 launches (best of ``--repeat`` runs; the plain
   unrecorded forward for comparison).
2. The gradient of a 2-D heat simulation (``--size`` squared, ``--steps`` steps):
   store-everything tape against ``kadj.checkpointed_loop`` with 10, 20 and 40
   snapshots: time, peak memory traced by tracemalloc (in state sizes), forward step
   executions per step measured and from the binomial schedule, and the largest
   difference from the store-everything gradient.

``--cuda``: the same two tables with ``@cuda.jit`` kernels on numba device arrays (a
CUDA GPU is required; without one it stops with exit status 2 and says why): per-launch
recording and replay cost of a CUDA launch, and the heat gradient's time, the tape's
peak snapshot bytes and the peak device memory in use (sampled at every step).

Usage::

    python scripts/bench_tape.py
    python scripts/bench_tape.py --size 128 --steps 1000 --repeat 5
    python scripts/bench_tape.py --cuda                  # on a GPU: 256x256 by default
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: perf/ and kadj/ live next to scripts/
    sys.path.insert(0, str(ROOT))

from perf import bench_tape as bench  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=None,
                   help="heat grid side (default 64; 256 with --cuda)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--launches", type=int, nargs="+", default=[100, 1000, 5000])
    p.add_argument("--snapshots", type=int, nargs="+", default=[10, 20, 40])
    p.add_argument("--cuda", action="store_true",
                   help="CUDA kernels on device arrays (needs a CUDA GPU)")
    args = p.parse_args(argv)
    if args.cuda:
        return cuda_main(args)
    args.size = args.size or 64
    bench.warm_up()

    forward = min(bench.plain_forward() for _ in range(args.repeat))
    print(f"Per-launch overhead: 1-D stencil, 64 elements, ping-pong "
          f"(plain forward {forward:.1f} us/launch)\n")
    print("| launches | record (us/launch) | replay (us/launch) |")
    print("|---:|---:|---:|")
    for n in args.launches:
        runs = [bench.record_and_replay(n) for _ in range(args.repeat)]
        rec, rep = min(r[0] for r in runs), min(r[1] for r in runs)
        print(f"| {n:,} | {rec:.1f} | {rep:.1f} |")

    print(f"\n2-D heat {args.size}x{args.size}, {args.steps} steps: gradient w.r.t. "
          "the initial field\n")
    print("| tape | time (s) | peak traced memory | x state | step executions / step "
          "(measured) | (binomial schedule) | max rel. diff. |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    reference = None
    for s in [None] + args.snapshots:
        timed = min((bench.heat_gradient(args.size, args.steps, s)
                     for _ in range(args.repeat)), key=lambda r: r["seconds"])
        traced = bench.heat_gradient(args.size, args.steps, s, trace=True)
        if reference is None:
            reference = timed["grad"]
        diff = float(np.max(np.abs(timed["grad"] - reference)) /
                     np.max(np.abs(reference)))
        name = "store everything" if s is None else f"checkpointed, s = {s}"
        peak = traced["peak_bytes"]
        print(f"| {name} | {timed['seconds']:.2f} | {peak / 2**20:.1f} MB | "
              f"{peak / traced['state_bytes']:.1f} | "
              f"{timed['executions'] / args.steps:.3f} | "
              f"{bench.theoretical_executions(args.steps, s) / args.steps:.3f} | "
              f"{diff:.1e} |")
    return 0


def cuda_main(args):
    problem = bench.cuda_problem()
    if problem is not None:
        print(f"bench_tape.py --cuda needs a CUDA GPU: {problem}", file=sys.stderr)
        return 2
    from numba import config, cuda
    args.size = args.size or 256
    where = "the CUDA simulator" if config.ENABLE_CUDASIM else \
        cuda.get_current_device().name.decode() \
        if isinstance(cuda.get_current_device().name, bytes) else \
        str(cuda.get_current_device().name)
    print(f"CUDA benchmark on {where}\n")
    bench.cuda_warm_up()

    forward = min(bench.cuda_plain_forward() for _ in range(args.repeat))
    print(f"Per-launch overhead: 1-D CUDA stencil, 64 elements, ping-pong, device "
          f"arrays (plain forward {forward:.1f} us/launch)\n")
    print("| launches | record (us/launch) | replay (us/launch) |")
    print("|---:|---:|---:|")
    for n in args.launches:
        runs = [bench.cuda_record_and_replay(n) for _ in range(args.repeat)]
        rec, rep = min(r[0] for r in runs), min(r[1] for r in runs)
        print(f"| {n:,} | {rec:.1f} | {rep:.1f} |")

    print(f"\n2-D heat {args.size}x{args.size} on the device, {args.steps} steps: "
          "gradient w.r.t. the initial field\n")
    print("| tape | time (s) | peak snapshots | x state | peak device memory in use | "
          "step executions / step (measured) | (binomial schedule) | max rel. diff. |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    reference = None
    for s in [None] + args.snapshots:
        r = min((bench.cuda_heat_gradient(args.size, args.steps, s)
                 for _ in range(args.repeat)), key=lambda r: r["seconds"])
        if reference is None:
            reference = r["grad"]
        diff = float(np.max(np.abs(r["grad"] - reference)) /
                     np.max(np.abs(reference)))
        name = "store everything" if s is None else f"checkpointed, s = {s}"
        snap = r["peak_snapshot_bytes"]
        print(f"| {name} | {r['seconds']:.2f} | {snap / 2**20:.1f} MB | "
              f"{snap / r['state_bytes']:.1f} | "
              f"{r['peak_device_bytes'] / 2**20:.1f} MB | "
              f"{r['executions'] / args.steps:.3f} | "
              f"{bench.theoretical_executions(args.steps, s) / args.steps:.3f} | "
              f"{diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
