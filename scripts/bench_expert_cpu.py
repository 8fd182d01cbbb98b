"""Single-thread CPU adjoints: kadj, with and without its vectorisable scalar sums,
against expert hand-written adjoints that keep several partial sums.

Cases: an element-wise affine map whose scalars' adjoints are pure sums, a 1-D heat step (4M points, float64 and float32), a degree-8 polynomial
(Horner, 9 coefficients shared by all elements), a per-element recurrence (32 steps)
and n-body accelerations (all pairs).  Each call is timed in process time (CPU time
of this process: set ``NUMBA_NUM_THREADS=1``), the best of ``--repeat`` calls after a
warm-up call that compiles; the forward, kadj's adjoint and the expert's take turns, one
call each per round, so that load from other work weighs on all three alike; adjoint
buffers are refilled outside the timed region.

"kadj before" is the same kadj with scalar adjoints summed by plain ``+=`` (the CPU
target's sum policy, :mod:`kadj.vector_sums`, switched off), or with ``--before lanes``
with replayed iterations run one at a time (:mod:`kadj.lane_jam` switched off); it runs
in a subprocess with its own adjoint cache, so the two versions never share a cached
adjoint.  kadj's
adjoint is checked against the expert's before timing.

Usage::

    NUMBA_NUM_THREADS=1 python scripts/bench_expert_cpu.py
    NUMBA_NUM_THREADS=1 python scripts/bench_expert_cpu.py --cases heat1d_f64 horner
    NUMBA_NUM_THREADS=1 python scripts/bench_expert_cpu.py --before lanes

Prints forward, kadj before, kadj after and expert times (ms), kadj/expert and
adjoint/forward.  Exits 1 when kadj disagrees with an expert adjoint.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numba import njit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernels.cpu.physics import nbody_accel  # noqa: E402
from perf.cases_cpu import (heat1d, horner, horner_adjoint, recurrence,  # noqa: E402
                            recurrence_adjoint)


# ---- expert adjoints ----------------------------------------------------------------------
@njit(inline="always", error_model="numpy")
def _heat_edge(g, alpha, c, j, m):
    t = c * g[j] if 1 <= j < m else 0.0 * g[j]
    if 1 <= j - 1 < m:
        t += alpha * g[j - 1]
    if j + 1 < m:
        t += alpha * g[j + 1]
    return t


@njit(error_model="numpy")
def heat1d_expert(u, u_new, alpha, adj_u, adj_u_new, adj_alpha):
    """Gather form in one pass (each adj_u[j] reads its three neighbours' cotangents:
    no scattered writes; a cotangent is consumed once no later point reads it), four
    points per step with four partial sums for alpha's adjoint."""
    n = u.shape[0]
    m = n - 1                       # interior points 1 .. m-1
    g = adj_u_new
    zero = alpha - alpha
    s0, s1, s2, s3 = zero, zero, zero, zero
    c = 1.0 - 2.0 * alpha
    for j in range(0, min(2, n)):   # the edges: only interior cotangents count
        adj_u[j] += _heat_edge(g, alpha, c, j, m)
    if m >= 2:                      # point 1's sum
        s0 += g[1] * (u[0] - 2.0 * u[1] + u[2])
    j = 2
    while j + 4 <= m - 1:           # j .. j+3 and all their neighbours interior
        s0 += g[j] * (u[j - 1] - 2.0 * u[j] + u[j + 1])
        s1 += g[j + 1] * (u[j] - 2.0 * u[j + 1] + u[j + 2])
        s2 += g[j + 2] * (u[j + 1] - 2.0 * u[j + 2] + u[j + 3])
        s3 += g[j + 3] * (u[j + 2] - 2.0 * u[j + 3] + u[j + 4])
        adj_u[j] += alpha * (g[j - 1] + g[j + 1]) + c * g[j]
        adj_u[j + 1] += alpha * (g[j] + g[j + 2]) + c * g[j + 1]
        adj_u[j + 2] += alpha * (g[j + 1] + g[j + 3]) + c * g[j + 2]
        adj_u[j + 3] += alpha * (g[j + 2] + g[j + 4]) + c * g[j + 3]
        g[j - 1] = 0.0
        g[j] = 0.0
        g[j + 1] = 0.0
        g[j + 2] = 0.0
        j += 4
    for i in range(max(j, 2), m):   # the rest of alpha's sum
        s0 += g[i] * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    for k in range(j, n):           # the rest of u's adjoint
        adj_u[k] += _heat_edge(g, alpha, c, k, m)
    for k in range(max(1, j - 1), m):
        g[k] = 0.0
    adj_alpha[0] += (s0 + s1) + (s2 + s3)


@njit(error_model="numpy")
def horner_expert(coeffs, x, y, adj_coeffs, adj_x, adj_y):
    """The derivative polynomial alongside the value (no stored iterates); four
    elements per pass, so each coefficient's adjoint gets four independent terms."""
    k = coeffs.shape[0]
    n = x.shape[0]
    i = 0
    while i + 4 <= n:
        g0, g1, g2, g3 = adj_y[i], adj_y[i + 1], adj_y[i + 2], adj_y[i + 3]
        adj_y[i] = 0.0
        adj_y[i + 1] = 0.0
        adj_y[i + 2] = 0.0
        adj_y[i + 3] = 0.0
        x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        w0, w1, w2, w3 = g0, g1, g2, g3
        for j in range(k):
            adj_coeffs[j] += (w0 + w1) + (w2 + w3)
            w0 *= x0
            w1 *= x1
            w2 *= x2
            w3 *= x3
        p0 = p1 = p2 = p3 = coeffs[k - 1]
        d0 = d1 = d2 = d3 = 0.0
        for j in range(k - 2, -1, -1):
            c = coeffs[j]
            d0 = d0 * x0 + p0
            d1 = d1 * x1 + p1
            d2 = d2 * x2 + p2
            d3 = d3 * x3 + p3
            p0 = p0 * x0 + c
            p1 = p1 * x1 + c
            p2 = p2 * x2 + c
            p3 = p3 * x3 + c
        adj_x[i] += g0 * d0
        adj_x[i + 1] += g1 * d1
        adj_x[i + 2] += g2 * d2
        adj_x[i + 3] += g3 * d3
        i += 4
    if i < n:      # the last n % 4 elements: one at a time
        horner_adjoint(coeffs, x[i:], y[i:], adj_coeffs, adj_x[i:], adj_y[i:])


@njit(inline="always", error_model="numpy")
def _pair(pos, mass, soft2, i, j, a0, a1, a2, adj_pos, adj_mass):
    """One pair's adjoint: writes body j's adjoints, returns body i's and soft2's."""
    dx = pos[j, 0] - pos[i, 0]
    dy = pos[j, 1] - pos[i, 1]
    dz = pos[j, 2] - pos[i, 2]
    r2 = dx * dx + dy * dy + dz * dz + soft2
    inv_r3 = 1.0 / (r2 * math.sqrt(r2))
    ad = a0 * dx + a1 * dy + a2 * dz
    adj_mass[j] += inv_r3 * ad
    mi = mass[j] * inv_r3
    h = -1.5 * mass[j] * ad * inv_r3 / r2          # d L / d r2
    gx = mi * a0 + 2.0 * h * dx
    gy = mi * a1 + 2.0 * h * dy
    gz = mi * a2 + 2.0 * h * dz
    adj_pos[j, 0] += gx
    adj_pos[j, 1] += gy
    adj_pos[j, 2] += gz
    return gx, gy, gz, h


@njit(error_model="numpy")
def nbody_expert(pos, mass, acc, soft2, adj_pos, adj_mass, adj_acc, adj_soft2):
    """Per body i, its row of pairs with two sets of partial sums for body i's and
    soft2's adjoints."""
    n = pos.shape[0]
    ss0 = 0.0
    ss1 = 0.0
    for i in range(n):
        a0, a1, a2 = adj_acc[i, 0], adj_acc[i, 1], adj_acc[i, 2]
        adj_acc[i, 0] = 0.0
        adj_acc[i, 1] = 0.0
        adj_acc[i, 2] = 0.0
        x0 = y0 = z0 = 0.0
        x1 = y1 = z1 = 0.0
        j = 0
        while j + 2 <= n:
            if j != i:
                gx, gy, gz, h = _pair(pos, mass, soft2, i, j, a0, a1, a2, adj_pos, adj_mass)
                x0 += gx
                y0 += gy
                z0 += gz
                ss0 += h
            if j + 1 != i:
                gx, gy, gz, h = _pair(pos, mass, soft2, i, j + 1, a0, a1, a2, adj_pos,
                                      adj_mass)
                x1 += gx
                y1 += gy
                z1 += gz
                ss1 += h
            j += 2
        if j < n and j != i:
            gx, gy, gz, h = _pair(pos, mass, soft2, i, j, a0, a1, a2, adj_pos, adj_mass)
            x0 += gx
            y0 += gy
            z0 += gz
            ss0 += h
        adj_pos[i, 0] -= x0 + x1
        adj_pos[i, 1] -= y0 + y1
        adj_pos[i, 2] -= z0 + z1
    adj_soft2[0] += ss0 + ss1


@njit
def affine(x, a, b, y):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + b


@njit(error_model="numpy")
def affine_expert(x, a, b, y, adj_x, adj_a, adj_b, adj_y):
    """Four partial sums for each scalar's adjoint."""
    n = x.shape[0]
    sa0 = sa1 = sa2 = sa3 = 0.0
    sb0 = sb1 = sb2 = sb3 = 0.0
    i = 0
    while i + 4 <= n:
        g0, g1, g2, g3 = adj_y[i], adj_y[i + 1], adj_y[i + 2], adj_y[i + 3]
        sa0 += g0 * x[i]
        sa1 += g1 * x[i + 1]
        sa2 += g2 * x[i + 2]
        sa3 += g3 * x[i + 3]
        sb0 += g0
        sb1 += g1
        sb2 += g2
        sb3 += g3
        adj_x[i] += g0 * a
        adj_x[i + 1] += g1 * a
        adj_x[i + 2] += g2 * a
        adj_x[i + 3] += g3 * a
        adj_y[i] = 0.0
        adj_y[i + 1] = 0.0
        adj_y[i + 2] = 0.0
        adj_y[i + 3] = 0.0
        i += 4
    while i < n:
        g = adj_y[i]
        sa0 += g * x[i]
        sb0 += g
        adj_x[i] += g * a
        adj_y[i] = 0.0
        i += 1
    adj_a[0] += (sa0 + sa1) + (sa2 + sa3)
    adj_b[0] += (sb0 + sb1) + (sb2 + sb3)


# ---- cases ----------------------------------------------------------------------------------
def _heat_args(dtype):
    def make(rng):
        n = 4_000_000
        return (rng.standard_normal(n).astype(dtype), np.zeros(n, dtype), dtype(0.2))
    return make


def _horner_args(rng):
    return (rng.standard_normal(9) / 2.0, rng.uniform(-1.0, 1.0, 500_000), np.zeros(500_000))


def _recurrence_args(rng):
    n = 200_000
    return (rng.standard_normal(n), rng.uniform(0.5, 0.95, n), 0.3, np.zeros(n), 32)


def _nbody_args(rng):
    p = 1000
    return (rng.standard_normal((p, 3)), rng.uniform(0.5, 1.5, p), np.zeros((p, 3)), 0.05)


def _affine_args(rng):
    n = 4_000_000
    return (rng.standard_normal(n), 0.7, -0.2, np.zeros(n))


#: name: (forward, expert adjoint, make_args(rng), what)
CASES = {
    "affine": (affine, affine_expert, _affine_args, "y = a*x + b, 4M f64 (a, b summed)"),
    "heat1d_f64": (heat1d, heat1d_expert, _heat_args(np.float64), "1-D heat step, 4M f64"),
    "heat1d_f32": (heat1d, heat1d_expert, _heat_args(np.float32), "1-D heat step, 4M f32"),
    "horner": (horner, horner_expert, _horner_args, "9 coefficients, 500k points"),
    "recurrence": (recurrence, recurrence_adjoint, _recurrence_args,
                   "x = x*a[i] + b, 32 steps, 200k"),
    "nbody": (nbody_accel, nbody_expert, _nbody_args, "all pairs, 1000 bodies"),
}


def _copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _rounds(timed, repeat):
    """{name: best seconds} of the calls ``timed`` ({name: (call, refill)}), each
    warmed up once, then timed once per round for ``repeat`` rounds, in turn: load
    from other work on the machine weighs on all of them alike."""
    for call, refill in timed.values():
        refill()
        call()                                # compiles
    best = dict.fromkeys(timed, math.inf)
    for _ in range(repeat):
        for name, (call, refill) in timed.items():
            refill()
            t0 = time.process_time()
            call()
            best[name] = min(best[name], time.process_time() - t0)
    return best


def _buffers(args, plan, rng):
    """Cotangent buffers in the plan's order: an array's filled at random (what its
    output receives), a scalar's a zero 1-element buffer of its precision."""
    out = []
    for i in plan.adjoint_args:
        a = args[i]
        if isinstance(a, np.ndarray):
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
        else:
            out.append(np.zeros(1, np.asarray(a).dtype))
    return out


def _setup(name):
    """(forward, expert adjoint, arguments, kadj's kernel, cotangent seeds) of a case."""
    import kadj
    fwd, expert, make, _ = CASES[name]
    args = make(np.random.default_rng(0))
    k = kadj.differentiate(fwd)
    seeds = _buffers(args, k.adjoint_plan(*args), np.random.default_rng(1))
    return fwd, expert, args, k, seeds


def _refill(bufs, seeds):
    return lambda: [np.copyto(b, s) for b, s in zip(bufs, seeds)]


def time_kadj(name, repeat):
    """Best seconds of kadj's adjoint alone (the "before" subprocess)."""
    _fwd, _expert, args, k, seeds = _setup(name)
    bufs = _copy(seeds)
    return _rounds({"kadj": (lambda: k.adjoint(*args, *bufs), _refill(bufs, seeds))},
                   repeat)["kadj"]


def _agree(got, want):
    worst = 0.0
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w.astype(np.float64)))), 1e-300)
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))) / scale)
    return worst


def bench(name, repeat):
    """Forward, kadj's adjoint and the expert's, timed in interleaved rounds."""
    fwd, expert, args, k, seeds = _setup(name)
    fargs = _copy(args)
    kbufs, ebufs = _copy(seeds), _copy(seeds)
    kadj_call = lambda: k.adjoint(*args, *kbufs)      # noqa: E731
    expert_call = lambda: expert(*args, *ebufs)       # noqa: E731
    best = _rounds({"forward": (lambda: fwd(*fargs), lambda: None),
                    "after": (kadj_call, _refill(kbufs, seeds)),
                    "expert": (expert_call, _refill(ebufs, seeds))}, repeat)
    for bufs, call in ((kbufs, kadj_call), (ebufs, expert_call)):
        _refill(bufs, seeds)()
        call()
    tol = 1e-3 if any(b.dtype == np.float32 for b in ebufs) else 1e-8
    err = _agree(kbufs, ebufs)
    return {"case": name, "what": CASES[name][3], **best, "error": err,
            "ok": err <= tol}


def _before(names, repeat, what):
    """kadj's times with ``what`` ("sums" or "lanes") switched off, from a subprocess
    with its own adjoint cache."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        env["KADJ_CACHE_DIR"] = cache
        out = subprocess.run([sys.executable, __file__, "--off", what, "--repeat",
                              str(repeat), "--cases", *names], env=env, check=True,
                             capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _off_run(what, names, repeat):
    import kadj.targets.cpu as cpu
    if what == "sums":
        cpu.vector_sums = lambda fn, w: w.syntax     # the policy off: plain += everywhere
    else:
        cpu.jam_replayed = lambda fn: 0              # replayed iterations one at a time
    print(json.dumps({n: time_kadj(n, repeat) for n in names}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--before", choices=("sums", "lanes"), default="sums",
                   help="what 'kadj before' switches off: the vectorisable sums "
                        "(default) or the replayed iterations run side by side")
    p.add_argument("--off", choices=("sums", "lanes"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.off:
        _off_run(a.off, a.cases, a.repeat)
        return 0
    if os.environ.get("NUMBA_NUM_THREADS") != "1":
        print("note: NUMBA_NUM_THREADS is not 1", file=sys.stderr)
    with tempfile.TemporaryDirectory() as cache:
        os.environ.setdefault("KADJ_CACHE_DIR", cache)
        rows = [bench(n, a.repeat) for n in a.cases]
    before = _before(a.cases, a.repeat, a.before)
    print(f"kadj before: {'plain sums' if a.before == 'sums' else 'one iteration at a time'}")
    print(f"{'case':<12} {'forward':>9} {'kadj before':>12} {'kadj after':>11} "
          f"{'expert':>9} {'before/exp':>11} {'after/exp':>10} {'after/fwd':>10} "
          f"{'exp/fwd':>8}  (ms, process time)")
    bad = False
    for r in rows:
        b = before[r["case"]]
        print(f"{r['case']:<12} {r['forward'] * 1e3:9.2f} {b * 1e3:12.2f} "
              f"{r['after'] * 1e3:11.2f} {r['expert'] * 1e3:9.2f} "
              f"{b / r['expert']:10.2f}x {r['after'] / r['expert']:9.2f}x "
              f"{r['after'] / r['forward']:9.2f}x {r['expert'] / r['forward']:7.2f}x"
              + ("" if r["ok"] else f"  DISAGREES (rel. error {r['error']:.1e})"))
        bad |= not r["ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
