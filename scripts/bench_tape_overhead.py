"""The Tape's per-launch overhead on many small launches: the demo's gradient.

The demo (``python -m kadj demo``) differentiates ``steps`` launches of a 2-D stencil
kernel (``kadj.demo.kernels_cpu.diffuse``, ``size`` x ``size``) run inside
``kadj.checkpointed_loop`` on a ``kadj.Tape``.  For each number of snapshots this prints
(best of ``--repeat`` runs, each part timed separately, in CPU time of the process,
which other processes on a busy machine do not inflate):

- ``forward``: the untaped loop (``CpuModel.loss``);
- ``taped``: the same loop recorded on a tape, and ``taped/fwd`` its ratio to it;
- ``backward``: ``tape.backward``, and ``bwd/fwd`` its ratio to the forward;
- ``kernels``: what the backward's kernels and copies alone cost: one adjoint per
  step, the forward steps the schedule recomputes (from the loop's memory report) and
  the copies of state arrays it restores and stores, each timed alone;
- ``fwd us/step`` and ``bwd us/step``: kadj's own cost per step (taped minus untaped
  forward minus the snapshot copies; backward minus its kernels and copies), in
  microseconds.

Usage::

    python scripts/bench_tape_overhead.py
    python scripts/bench_tape_overhead.py --size 128 --steps 200 --snapshots 14 200
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


# CPU time of this process: the machine's other processes do not inflate it
_clock = time.process_time


def _best(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = _clock()
        fn()
        best = min(best, _clock() - t0)
    return best


def kernel_times(problem, repeat):
    """(forward, adjoint) seconds of one ``diffuse`` call, kernels alone."""
    from kadj.demo import kernels_cpu as k
    u, v = problem.u0.copy(), np.zeros_like(problem.u0)
    kappa = np.ascontiguousarray(problem.kappa_start).copy()
    args = (u, v, kappa, problem.r)
    comp = k.diffuse.compiled(*args)
    adjs = (np.zeros_like(u), np.zeros_like(v), np.zeros_like(kappa), np.zeros(1))
    adjs = tuple(a for a, i in zip(adjs, range(4)) if i in comp.plan.adjoint_args)
    call = (*args, *adjs, *comp.fresh_memory())

    def many(fn, n=20):
        def run():
            for _ in range(n):
                fn()
        return _best(run, repeat) / n
    return (many(lambda: k.diffuse.forward(*args)), many(lambda: comp.function(*call)),
            many(lambda: np.copyto(v, u)))


def copies(steps, snapshots, k=2):
    """(forward, backward) copies of state arrays the binomial schedule makes: the
    snapshots stored (the tape's copy of state 0 included), and in the backward the
    restores and stores (``k`` arrays each)."""
    from kadj import schedules
    sched = schedules.binomial(steps, snapshots)
    fwd = 1 + sum(1 for a in sched.forward if a[0] == schedules.STORE and a[1] != 0)
    bwd = sum(1 for a in sched.backward
              if a[0] in (schedules.RESTORE, schedules.STORE))
    return k * fwd, k * bwd


def measure(problem, snapshots, repeat):
    import kadj
    from kadj.demo import models
    m = models.CpuModel(problem, snapshots=snapshots)
    x = problem.kappa_start.ravel()
    m.loss(x)
    m.loss_and_grad(x)                          # compile and warm up
    fwd = taped = bwd = float("inf")
    executions = 0
    for _ in range(repeat):                     # interleaved, best of each
        kappa = m._field(x)
        t0 = _clock()
        m.loss(x)
        t1 = _clock()
        with kadj.Tape() as tape:
            out = m._run(kappa)
        t2 = _clock()
        tape.backward(out, wrt=[kappa])
        t3 = _clock()
        fwd, taped, bwd = min(fwd, t1 - t0), min(taped, t2 - t1), min(bwd, t3 - t2)
        executions = sum(loop.forward_executions
                         for loop in tape.memory_report().loops)
    return fwd, taped, bwd, executions


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--snapshots", type=int, nargs="+", default=[14, 200])
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args(argv)
    import kadj
    from kadj.demo import problem as demo_problem
    problem = demo_problem.make_problem(args.size, args.steps)
    rows = [(s, *measure(problem, s, args.repeat)) for s in args.snapshots]
    t_fwd, t_adj, t_copy = kernel_times(problem, args.repeat)
    n = args.steps
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"kadj {os.path.dirname(kadj.__file__)}; {args.size}x{args.size}, {n} steps, "
          f"best of {args.repeat} (CPU time); load average {load:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"alone: forward kernel {t_fwd * 1e6:.0f} us, adjoint kernel "
          f"{t_adj * 1e6:.0f} us, copy of a state array {t_copy * 1e6:.0f} us")
    head = (f"{'snapshots':>9} {'forward':>9} {'taped':>9} {'taped/fwd':>9} "
            f"{'backward':>9} {'bwd/fwd':>8} {'kernels':>9} {'fwd us/step':>11} "
            f"{'bwd us/step':>11}")
    print(head)
    for snaps, fwd, taped, bwd, executions in rows:
        recomputed = max(0, executions - n)     # the backward's forward steps
        fwd_copies, bwd_copies = copies(n, snaps)
        kernels = n * t_adj + recomputed * t_fwd + bwd_copies * t_copy
        print(f"{snaps:>9} {fwd * 1e3:>7.1f}ms {taped * 1e3:>7.1f}ms "
              f"{taped / fwd:>9.2f} {bwd * 1e3:>7.1f}ms {bwd / fwd:>8.2f} "
              f"{kernels * 1e3:>7.1f}ms "
              f"{(taped - fwd - fwd_copies * t_copy) / n * 1e6:>11.0f} "
              f"{(bwd - kernels) / n * 1e6:>11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
