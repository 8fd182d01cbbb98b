"""Time kadj's CPU adjoints against the forward kernels and careful hand-written adjoints.

For every case in ``perf/cases_cpu.py`` this times, in one run:

- the plain ``@njit`` forward, and the same kernel called through ``kadj.differentiate``
  (the decorated forward should cost the same);
- the hand-written adjoint and kadj's generated adjoint (``kernel.adjoint``),
- for the stencils, an expert's adjoint in the gather form (:data:`EXPERT`),

each as the median of ``--repeat`` calls after warm-up (compilation included in the
warm-up, never in the timings); the calls take turns, so that load from other
processes affects them alike.  Adjoint buffers are in/out, so before every call they
are refilled from the same seeds with ``np.copyto`` into preallocated buffers, outside
the timed region: only the call itself is measured.  It then checks that kadj's adjoint
(and the expert's) agree with the hand-written one, and prints a table with
adjoint/forward, kadj/hand and kadj/expert ratios.

Usage::

    python scripts/bench_cpu.py                 # large sizes (~1-10 ms per forward)
    python scripts/bench_cpu.py --size small --repeat 50
    python scripts/bench_cpu.py --cases heat1d spmv
    python scripts/bench_cpu.py --stat min      # on a busy machine
    python scripts/bench_cpu.py --clock cpu     # CPU time of the calling thread (serial
                                                # kernels only), on a very busy machine

Exits with status 1 when kadj's adjoint disagrees with the hand-written one or fails.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: perf/ and kadj/ live next to scripts/
    sys.path.insert(0, str(ROOT))

from numba import njit  # noqa: E402

from perf.cases_cpu import CASES, copy_args, make_adjoints  # noqa: E402

RTOL = 1e-8  # kadj and the hand-written adjoint may sum in different orders


# --------------------------------------------------------------------------------------
# Expert adjoints in the gather form: each adjoint element written once, the interior
# loop free of branches (so that it vectorises), the edges handled with bounds checks,
# then the scalar's sum in a loop of its own (a floating-point sum does not vectorise
# without fastmath and would keep the gather loop scalar), which also consumes the
# incoming cotangent (the gather reads each element three or five times).
# --------------------------------------------------------------------------------------


@njit
def heat1d_expert(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    n = u.shape[0]
    g = adj_u_new
    c = 1.0 - 2.0 * alpha
    hi = max(n - 2, 2)  # interior p in [2, n - 3]: all three readers exist
    for p in range(2, hi):
        adj_u[p] += c * g[p] + alpha * (g[p - 1] + g[p + 1])
    for e in range(min(2, n) + n - hi):  # p in {0, 1, n - 2, n - 1}, each once
        p = e if e < 2 else e - min(2, n) + hi
        acc = 0.0
        for o in (-1, 0, 1):
            q = p - o
            if 1 <= q < n - 1:
                acc += (c if o == 0 else alpha) * g[q]
        adj_u[p] += acc
    s = 0.0
    for i in range(1, n - 1):
        s += g[i] * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        g[i] = 0.0  # read by three elements' gathers above: consumed once they are done
    adj_alpha[0] += s


@njit
def _heat2d_edge(g, c, alpha, n, m, i, j):
    acc = 0.0
    if 1 <= i < n - 1 and 1 <= j < m - 1:
        acc += c * g[i, j]
    if 1 <= i - 1 and 1 <= j < m - 1:
        acc += alpha * g[i - 1, j]
    if i + 1 < n - 1 and 1 <= j < m - 1:
        acc += alpha * g[i + 1, j]
    if 1 <= i < n - 1 and 1 <= j - 1:
        acc += alpha * g[i, j - 1]
    if 1 <= i < n - 1 and j + 1 < m - 1:
        acc += alpha * g[i, j + 1]
    return acc


@njit
def heat2d_expert(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    n, m = u.shape
    g = adj_u_new
    c = 1.0 - 4.0 * alpha
    hj = max(m - 2, 2)
    for i in range(n):
        if 2 <= i < n - 2:
            for j in range(2, hj):
                adj_u[i, j] += c * g[i, j] + alpha * (g[i - 1, j] + g[i + 1, j]
                                                      + g[i, j - 1] + g[i, j + 1])
            for j in range(min(2, m)):
                adj_u[i, j] += _heat2d_edge(g, c, alpha, n, m, i, j)
            for j in range(hj, m):
                adj_u[i, j] += _heat2d_edge(g, c, alpha, n, m, i, j)
        else:
            for j in range(m):
                adj_u[i, j] += _heat2d_edge(g, c, alpha, n, m, i, j)
    s = 0.0
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            s += g[i, j] * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                            - 4.0 * u[i, j])
            g[i, j] = 0.0
    adj_alpha[0] += s


EXPERT = {"heat1d": heat1d_expert, "heat2d": heat2d_expert}


CLOCK = time.perf_counter


def time_calls(calls, repeat, stat=statistics.median):
    """:func:`kadj.timing.interleaved_times` on wall time (``--clock``)."""
    from kadj.timing import interleaved_times
    return interleaved_times(calls, repeat, stat, CLOCK)


def _load_kadj():
    try:
        import kadj

        return kadj.differentiate, None
    except Exception as exc:  # the core may not be importable in this checkout
        return None, f"{type(exc).__name__}: {exc}"


def _agree(got, expected):
    """Max error of ``got`` relative to the size of ``expected``, over all buffers."""
    worst = 0.0
    for g, e in zip(got, expected):
        scale = max(float(np.max(np.abs(e))), 1e-300)
        worst = max(worst, float(np.max(np.abs(g - e))) / scale)
    return worst


def bench_case(case, size, repeat, differentiate, seed=0, stat=statistics.median):
    """Time one case; returns a dict of results (times in seconds)."""
    rng = np.random.default_rng(seed)
    n = case.size(size)
    args = case.make_args(n, rng)  # the pre-call state every adjoint call sees
    seeds = make_adjoints(case, args, rng)
    fwd_args = copy_args(args)  # the forward writes its outputs; keep args pristine

    work = tuple(np.empty_like(s) for s in seeds)

    def refill():
        for w, s in zip(work, seeds):
            np.copyto(w, s)

    result = {"case": case.name, "n": n, "description": case.description}
    calls = {}

    # warm-up: every call runs (and compiles) before timing starts
    case.forward(*fwd_args)
    calls["fwd"] = (lambda: case.forward(*fwd_args), None)

    refill()
    case.hand_adjoint(*args, *work)
    hand_out = tuple(w.copy() for w in work)
    calls["hand"] = (lambda: case.hand_adjoint(*args, *work), refill)

    expert = EXPERT.get(case.name)
    if expert is not None:
        refill()
        expert(*args, *work)
        result["expert_err"] = _agree(tuple(w.copy() for w in work), hand_out)
        calls["expert"] = (lambda: expert(*args, *work), refill)

    if differentiate is not None:
        try:
            kernel = differentiate(case.forward)
            kernel(*fwd_args)
            refill()
            before = copy_args(args)
            kernel.adjoint(*args, *work)
            result["err"] = _agree(tuple(w.copy() for w in work), hand_out)
            if not all(np.array_equal(a, b) for a, b in zip(args, before)):
                raise AssertionError("kadj's adjoint modified a forward argument")
            calls["kfwd"] = (lambda: kernel(*fwd_args), None)
            calls["kadj"] = (lambda: kernel.adjoint(*args, *work), refill)
        except Exception:
            result["error"] = traceback.format_exc()

    for name, (call, refill_) in calls.items():  # a second warm-up call each
        if refill_ is not None:
            refill_()
        call()
    result.update(time_calls(calls, repeat, stat))
    return result


_UNIT = {"ms": 1e3, "us": 1e6}


def _fmt(seconds, unit):
    return f"{seconds * _UNIT[unit]:9.3f}"


def _ratio(a, b):
    return f"{a / b:6.2f}x"


def print_table(results, size, repeat, stat="median"):
    unit = "ms" if max(r["fwd"] for r in results) >= 1e-3 else "us"
    print(f"\nkadj CPU benchmarks: size={size}, {stat} of {repeat} calls, times in {unit}\n")
    header = (
        f"{'case':<11} {'n':>9} {'forward':>9} {'fwd kadj':>9} {'hand adj':>9} {'kadj adj':>9}"
        f" {'hand/fwd':>8} {'kadj/fwd':>8} {'kadj/hand':>9}  {'max rel err':>11}"
        f" {'expert':>9} {'kadj/expert':>11}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        line = f"{r['case']:<11} {r['n']:>9} {_fmt(r['fwd'], unit)} "
        line += _fmt(r["kfwd"], unit) if "kfwd" in r else f"{'-':>9}"
        line += f" {_fmt(r['hand'], unit)} "
        line += _fmt(r["kadj"], unit) if "kadj" in r else f"{'-':>9}"
        line += f" {_ratio(r['hand'], r['fwd']):>8}"
        if "kadj" in r:
            line += f" {_ratio(r['kadj'], r['fwd']):>8} {_ratio(r['kadj'], r['hand']):>9}"
            flag = "" if r["err"] <= RTOL else "  MISMATCH"
            line += f"  {r['err']:11.2e}{flag}"
        else:
            line += f" {'-':>8} {'-':>9}  {'-':>11}"
        if "expert" in r:
            line += f" {_fmt(r['expert'], unit)}"
            line += f" {_ratio(r['kadj'], r['expert']):>11}" if "kadj" in r else f" {'-':>11}"
        print(line)
    print()
    for r in results:
        print(f"  {r['case']:<11} {r['description']}")
    if any("expert" in r for r in results):
        print("\n  expert: a hand-written adjoint in the gather form (each element written "
              "once, vectorised interior)")
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("small", "large"), default="large")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="statistic over the repetitions (min is robust to load from "
                             "other processes)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or the CPU time of the calling thread (for serial "
                             "kernels on a machine shared with other processes)")
    opts = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.thread_time if opts.clock == "cpu" else time.perf_counter

    cases = CASES
    if opts.cases:
        known = {c.name: c for c in CASES}
        unknown = [name for name in opts.cases if name not in known]
        if unknown:
            parser.error(f"unknown case(s) {unknown}; known: {sorted(known)}")
        cases = tuple(known[name] for name in opts.cases)

    differentiate, why = _load_kadj()
    if differentiate is None:
        print(f"kadj is not available ({why}); timing forward and hand-written adjoints only")

    results = []
    failed = False
    for case in cases:
        r = bench_case(case, opts.size, max(1, opts.repeat), differentiate,
                       stat=min if opts.stat == "min" else statistics.median)
        results.append(r)
        if "error" in r:
            failed = True
            print(f"kadj failed on case {case.name}:\n{r['error']}", file=sys.stderr)
        elif "err" in r and r["err"] > RTOL:
            failed = True
        if r.get("expert_err", 0.0) > RTOL:
            failed = True
            print(f"the expert adjoint of {case.name} disagrees with the hand-written one",
                  file=sys.stderr)
    print_table(results, opts.size, opts.repeat, opts.stat)
    if failed:
        print("FAILED: kadj's adjoint failed or disagrees with the hand-written adjoint")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
