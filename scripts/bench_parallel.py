"""Time parallel CPU adjoints of prange kernels at 1, 2, ... threads.

For each kernel: the forward (``@njit(parallel=True)``) and kadj's adjoint (parallel
where :mod:`kadj.parallel` allows it) are timed at each thread count
(``numba.set_num_threads``), as the median of ``--repeat`` calls after warm-up; adjoint
buffers are refilled outside the timed region.  Prints one markdown table: time per
call and the adjoint/forward ratio per thread count.  A parallel adjoint keeps its
ratio as threads are added (within ~20% of the single-threaded ratio); a serial one's
ratio grows with the forward's speed-up.  The prange stencils' adjoints take the gather
form, run in parallel; each is also timed with ``parallel=False`` (the serial gather
form) for comparison.  Forward and adjoint take turns within each round
(:func:`kadj.timing.interleaved_times`).

Usage::

    python scripts/bench_parallel.py                    # 1, 2, ... all threads
    python scripts/bench_parallel.py --threads 1 2 --n 2000000 --repeat 15
    python scripts/bench_parallel.py --only heat_stencil diffusion_2d
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import kadj  # noqa: E402
from kadj.parallel import is_parallel_source  # noqa: E402
from kadj.timing import interleaved_times  # noqa: E402
from kernels.cpu.misc import allen_cahn_reaction_parallel  # noqa: E402
from kernels.cpu.stencils import diffusion_1d_parallel, diffusion_2d_parallel  # noqa: E402


@njit(parallel=True)
def damped_map(x, y, out, a):
    for i in prange(x.shape[0]):
        out[i] = a * x[i] * math.exp(-y[i]) + math.tanh(x[i])


@njit(parallel=True)
def row_scale(x, w, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = math.sin(x[i, j]) * w[i]


@njit(parallel=True)
def weighted_sum(x, w):
    s = 0.0
    for i in prange(x.shape[0]):
        s += w[i] * math.sin(x[i])
    return s


@njit(parallel=True)
def sin_in_place(x, y):
    # records t and the test's outcome per iteration (rows of the tape)
    for i in prange(x.shape[0]):
        t = y[i]
        y[i] = math.sin(t) * x[i]
        if y[i] > 0:
            y[i] = y[i] * 2.0


@njit(parallel=True)
def steps_in_place(x, y, steps):
    # a prange loop in a time loop, recording per iteration (rows per step)
    for t in range(steps):
        for i in prange(y.shape[0]):
            v = math.sin(y[i])
            y[i] = v * x[i] + 0.1 * t


@njit(parallel=True)
def soft_clip(x, out, lo, hi):
    # replayed iterations (a local reassigned under branches): parallel blocks
    for i in prange(x.shape[0]):
        v = x[i]
        if v > hi:
            v = hi + math.log(1.0 + v - hi)
        elif v < lo:
            v = lo - math.log(1.0 + lo - v)
        out[i] = v * v


@njit(parallel=True)
def newton_cbrt(a, out):
    # a per-element Newton iteration, replayed and reversed in each element
    for i in prange(a.shape[0]):
        y = 1.0
        for it in range(8):
            y = y - (y * y * y - a[i]) / (3.0 * y * y)
        out[i] = y


@njit(parallel=True)
def index_gather(x, idx, w, out):
    # adj_x[idx[i]] += ...: iterations add into shared elements (parts, kadj.thread_parts)
    for i in prange(idx.shape[0]):
        out[i] = w[i] * math.sin(x[idx[i]])


@njit(parallel=True)
def matvec_rows(a, x, y):
    # adj_x[j] += ... for every row: a shared vector (parts)
    for i in prange(a.shape[0]):
        s = 0.0
        for j in range(a.shape[1]):
            s += a[i, j] * x[j]
        y[i] = s


@njit(parallel=True)
def heat_stencil(u, out, alpha):
    for i in prange(1, u.shape[0] - 1):
        out[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit(parallel=True)
def stencil_3d(u, kappa, out, dt):
    for i in prange(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            for k in range(1, u.shape[2] - 1):
                lap = (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] + u[i, j + 1, k]
                       + u[i, j, k - 1] + u[i, j, k + 1] - 6.0 * u[i, j, k])
                out[i, j, k] = u[i, j, k] + dt * kappa[i, j, k] * lap


def cases(n, rng):
    m = max(1, n // 64)
    s2 = max(3, int(round(math.sqrt(n))))
    s3 = max(3, int(round(n ** (1 / 3))))
    d1 = (rng.standard_normal(n), 0.5 + rng.random(n), np.zeros(n), 0.2)
    d2 = (rng.standard_normal((s2, s2 + 8)), 0.5 + rng.random((s2, s2 + 8)),
          np.zeros((s2, s2 + 8)), 0.1)
    d3 = (rng.standard_normal((s3, s3 + 2, s3 + 4)), 0.5 + rng.random((s3, s3 + 2, s3 + 4)),
          np.zeros((s3, s3 + 2, s3 + 4)), 0.1)
    heat = (rng.standard_normal(n), np.zeros(n), 0.3)
    inplace = (rng.uniform(0.5, 1.0, n), rng.standard_normal(n))
    clip = (rng.uniform(-2.0, 2.0, n), np.zeros(n), -0.5, 0.7)
    steps = (rng.uniform(0.5, 1.0, n // 4), rng.standard_normal(n // 4), 4)
    reaction = (rng.uniform(-0.9, 0.9, n), 0.5 + rng.random(n), 0.1, 4)
    cbrt = (rng.uniform(0.5, 2.0, n), np.zeros(n))
    gather = (rng.standard_normal(n), rng.integers(0, n, n), rng.random(n), np.zeros(n))
    mv = (rng.standard_normal((max(1, n // 1000), 1000)), rng.standard_normal(1000),
          np.zeros(max(1, n // 1000)))
    return {
        "damped_map": (damped_map, (rng.standard_normal(n), rng.random(n), np.zeros(n),
                                    0.8)),
        "row_scale": (row_scale, (rng.standard_normal((m, 64)), rng.standard_normal(m),
                                  np.zeros((m, 64)))),
        "weighted_sum": (weighted_sum, (rng.standard_normal(n), rng.standard_normal(n))),
        "sin_in_place": (sin_in_place, inplace),
        "sin_in_place, parallel=False": (sin_in_place, inplace, {"parallel": False}),
        "allen_cahn_reaction": (allen_cahn_reaction_parallel, reaction),
        "allen_cahn_reaction, parallel=False": (allen_cahn_reaction_parallel, reaction,
                                                {"parallel": False}),
        "steps_in_place": (steps_in_place, steps),
        "steps_in_place, parallel=False": (steps_in_place, steps, {"parallel": False}),
        "soft_clip": (soft_clip, clip),
        "soft_clip, parallel=False": (soft_clip, clip, {"parallel": False}),
        "newton_cbrt": (newton_cbrt, cbrt),
        "newton_cbrt, parallel=False": (newton_cbrt, cbrt, {"parallel": False}),
        "index_gather": (index_gather, gather),
        "index_gather, parallel=False": (index_gather, gather, {"parallel": False}),
        "matvec_rows": (matvec_rows, mv),
        "matvec_rows, parallel=False": (matvec_rows, mv, {"parallel": False}),
        "heat_stencil": (heat_stencil, heat),
        "heat_stencil, parallel=False": (heat_stencil, heat, {"parallel": False}),
        "diffusion_1d": (diffusion_1d_parallel, d1),
        "diffusion_1d, parallel=False": (diffusion_1d_parallel, d1, {"parallel": False}),
        "diffusion_2d": (diffusion_2d_parallel, d2),
        "diffusion_2d, parallel=False": (diffusion_2d_parallel, d2, {"parallel": False}),
        "stencil_3d": (stencil_3d, d3),
        "stencil_3d, parallel=False": (stencil_3d, d3, {"parallel": False, "gather": True}),
    }


def bench(name, kernel, args, threads, repeat, options=None):
    k = kadj.differentiate(kernel, **(options or {}))
    plan = k.adjoint_plan(*args)
    src = k.adjoint_source(*args)
    rng = np.random.default_rng(3)
    seeds = [rng.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
             else np.zeros(1) for i in plan.adjoint_args]
    bufs = [s.copy() for s in seeds]
    kw = {"adj_return": 1.0} if plan.returns_value else {}

    def refill():
        for b, s in zip(bufs, seeds):
            np.copyto(b, s)
    row = [name, "yes" if is_parallel_source(src) else "no"]
    for t in threads:
        numba.set_num_threads(t)
        kernel(*args)
        k.adjoint(*args, *bufs, **kw)       # warm-up (compiles)
        times = interleaved_times({"fwd": (lambda: kernel(*args), None),
                                   "adj": (lambda: k.adjoint(*args, *bufs, **kw), refill)},
                                  repeat)
        fwd, adj = times["fwd"], times["adj"]
        row.append(f"{fwd * 1e3:.2f} / {adj * 1e3:.2f} ms = {adj / fwd:.2f}")
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--threads", type=int, nargs="*", default=None)
    p.add_argument("--only", nargs="*", default=None,
                   help="cases whose name starts with one of these")
    opts = p.parse_args(argv)
    most = numba.config.NUMBA_NUM_THREADS
    threads = opts.threads or sorted({1, 2, most} & set(range(1, most + 1)))
    print(f"{most} threads available (NUMBA_NUM_THREADS); n = {opts.n}; "
          f"median of {opts.repeat} calls\n")
    head = ["kernel", "parallel adjoint"] + [f"{t} thr: fwd / adj = ratio"
                                             for t in threads]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, (kernel, args, *options) in cases(opts.n, np.random.default_rng(0)).items():
        if opts.only and not any(name.startswith(o) for o in opts.only):
            continue
        row = bench(name, kernel, args, threads, opts.repeat, *options)
        print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
