"""Time kadj's forward mode and Hessian-vector products on the CPU, in one run.

Two tables, each entry the median of ``--repeat`` calls after warm-up (compilation in
the warm-up, never in the timings; the calls of one row take turns, so that load from
other processes affects them alike; buffers the calls modify are refilled untimed):

- JVP / forward: ``kernel.jvp`` (the forward and its tangent in one sweep) against the
  plain ``@njit`` forward, for the stencils and kernels of ``perf/cases_cpu.py``
  (target: at most 2x on stencils); also the compiled tangent function called directly
  (``tangent fn``: what ``jvp`` runs after checking its arguments, ~50 us of Python);
- HVP / gradient: ``kadj.hvp(f)(*args, v)`` against ``kadj.grad(f)(*args)``, and the
  gradient against the forward, for a 2-layer MLP loss, a Lennard-Jones energy and the
  Rosenbrock function (target: at most 4x).

Usage::

    python scripts/bench_jvp.py                  # ~1-10 ms per forward
    python scripts/bench_jvp.py --size small --repeat 50
    python scripts/bench_jvp.py --stat min       # on a busy machine
    python scripts/bench_jvp.py --stat min --clock thread   # CPU time of this thread

Prints markdown tables and the load average (1 min) before and after.  Benchmarks
only: nothing here is asserted by the tests.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: perf/ and kadj/ live next to scripts/
    sys.path.insert(0, str(ROOT))

import kadj  # noqa: E402
from kadj import jvp_call  # noqa: E402
from perf.cases_cpu import CASES  # noqa: E402

CLOCK = {"wall": time.perf_counter, "thread": time.thread_time}
_clock = time.perf_counter


def time_calls(calls, repeat, stat=statistics.median):
    """:func:`kadj.timing.interleaved_times` on the clock chosen (``--clock``)."""
    from kadj.timing import interleaved_times
    return interleaved_times(calls, repeat, stat, _clock)


# ---- functions returning a float, for the HVP -------------------------------------------
@njit
def mlp_loss(w1, b1, w2, xs, ys, hidden):
    m, d = xs.shape
    nh = w1.shape[0]
    loss = 0.0
    for s in range(m):
        for k in range(nh):
            a = b1[k]
            for j in range(d):
                a += w1[k, j] * xs[s, j]
            hidden[k] = math.tanh(a)
        out = 0.0
        for k in range(nh):
            out += w2[k] * hidden[k]
        r = out - ys[s]
        loss += r * r
    return loss / m


@njit
def lennard_jones(pos, eps, sigma):
    n = pos.shape[0]
    e = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            dx = pos[i, 0] - pos[j, 0]
            dy = pos[i, 1] - pos[j, 1]
            dz = pos[i, 2] - pos[j, 2]
            r2 = dx * dx + dy * dy + dz * dz
            sr6 = (sigma * sigma / r2) ** 3
            e += 4.0 * eps * (sr6 * sr6 - sr6)
    return e


@njit
def rosenbrock(x):
    s = 0.0
    for i in range(x.shape[0] - 1):
        s += 100.0 * (x[i + 1] - x[i] * x[i]) ** 2 + (1.0 - x[i]) ** 2
    return s


def _mlp(n, rng):
    nh, d = 32, 16
    return (0.3 * rng.standard_normal((nh, d)), 0.1 * rng.standard_normal(nh),
            0.3 * rng.standard_normal(nh), rng.standard_normal((n, d)),
            rng.standard_normal(n), np.zeros(nh))


def _lj(n, rng):
    side = int(round(n ** (1 / 3))) + 1
    g = np.array([[i, j, k] for i in range(side) for j in range(side)
                  for k in range(side)], float)[:n]
    return (1.2 * g + 0.05 * rng.standard_normal(g.shape), 1.0, 1.0)


HVP_CASES = (   # name, description, function, make_args(n, rng), n small, n large
    ("mlp", "2-layer MLP loss (tanh), 16-32-1, argnums=w1", mlp_loss, _mlp, 200, 4000),
    ("lennard_jones", "Lennard-Jones energy, argnums=positions", lennard_jones, _lj,
     100, 800),
    ("rosenbrock", "Rosenbrock function", rosenbrock, lambda n, rng:
     (rng.uniform(-1.5, 1.5, n),), 10_000, 1_000_000),
)


def _refiller(dsts):
    """(refill, the buffers): copies of ``dsts`` restored from their first values."""
    saved = [d.copy() if isinstance(d, np.ndarray) else None for d in dsts]

    def refill():
        for d, s in zip(dsts, saved):
            if s is not None:
                np.copyto(d, s)
    return refill


def jvp_rows(size, repeat, stat):
    rows = []
    rng = np.random.default_rng(0)
    for case in CASES:
        args = case.make_args(case.size(size), rng)
        k = kadj.differentiate(case.forward)
        plan = k.adjoint_plan(*args)
        tangents = [rng.standard_normal(np.shape(args[i])).astype(np.asarray(args[i]).dtype)
                    if isinstance(args[i], np.ndarray) else
                    rng.standard_normal(1) for i in plan.adjoint_args]
        fwd_args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        jvp_args = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        refill_f = _refiller(fwd_args)
        refill_j = _refiller(list(jvp_args) + tangents)
        k.jvp(*jvp_args, *tangents)                             # compiles
        tangent_fn = jvp_call.compiled(k, jvp_args).function
        calls = {"forward": (lambda: case.forward(*fwd_args), refill_f),
                 "jvp": (lambda: k.jvp(*jvp_args, *tangents), refill_j),
                 "tangent": (lambda: tangent_fn(*jvp_args, *tangents), refill_j)}
        time_calls(calls, 2)                                    # warm-up
        t = time_calls(calls, repeat, stat)
        rows.append((case.name, case.description, t["forward"], t["jvp"], t["tangent"]))
    return rows


def hvp_rows(size, repeat, stat):
    rows = []
    rng = np.random.default_rng(1)
    for name, desc, f, make, n_small, n_large in HVP_CASES:
        args = make(n_small if size == "small" else n_large, rng)
        v = rng.standard_normal(args[0].shape)
        grad, hvp = kadj.grad(f), kadj.hvp(f)
        calls = {"forward": (lambda: f(*args), None),
                 "gradient": (lambda: grad(*args), None),
                 "hvp": (lambda: hvp(*args, v), None)}
        time_calls(calls, 2)
        t = time_calls(calls, repeat, stat)
        rows.append((name, desc, t["forward"], t["gradient"], t["hvp"]))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("small", "large"), default="large")
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--stat", choices=("median", "min"), default="median")
    p.add_argument("--clock", choices=tuple(CLOCK), default="wall",
                   help="wall-clock time, or the CPU time of this thread (steadier on "
                        "a shared machine)")
    opts = p.parse_args(argv)
    stat = statistics.median if opts.stat == "median" else min
    global _clock
    _clock = CLOCK[opts.clock]

    def ms(t):
        return f"{1e3 * t:.3f}"

    print(f"{opts.stat} of {opts.repeat} calls, {opts.clock} clock; load average "
          f"(1 min) before: {os.getloadavg()[0]:.2f}")
    print()
    print("| kernel | forward (ms) | jvp (ms) | jvp/forward | tangent fn/forward |")
    print("|---|---:|---:|---:|---:|")
    for name, desc, tf, tj, tt in jvp_rows(opts.size, opts.repeat, stat):
        print(f"| {name}: {desc} | {ms(tf)} | {ms(tj)} | {tj / tf:.2f}x "
              f"| {tt / tf:.2f}x |")
    print()
    print("| function | forward (ms) | gradient (ms) | hvp (ms) | gradient/forward "
          "| hvp/gradient |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, desc, tf, tg, th in hvp_rows(opts.size, opts.repeat, stat):
        print(f"| {name}: {desc} | {ms(tf)} | {ms(tg)} | {ms(th)} | {tg / tf:.2f}x "
              f"| {th / tg:.2f}x |")
    print()
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
