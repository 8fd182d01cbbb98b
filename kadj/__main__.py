"""kadj's command line.

``python -m kadj demo``
    Differentiates a heat-equation solver end to end on the CPU: a few explicit time
    steps of ``heat_step`` and a squared-error loss, recorded on a :class:`kadj.Tape`.
    It prints the generated adjoint of ``heat_step``, checks the gradient of the loss
    with respect to the initial temperature against central finite differences (exit
    status 1 when the maximum relative error exceeds ``--tol``), and prints what the
    gradient costs relative to the forward run.

``python -m kadj show MODULE:FUNC --args EXPR``
    Prints the adjoint kadj generates for a kernel.  ``MODULE`` is a dotted module name
    (importable from the current directory) or a path to a ``.py`` file; ``FUNC`` is an
    ``@njit`` kernel or a ``kadj.differentiate``-d one.  ``EXPR`` is a Python expression
    for example arguments, evaluated with ``np`` (NumPy) in scope, for instance
    ``--args "np.zeros(8), np.zeros(8), 0.1"``.

``python -m kadj show MODULE:FUNC --args EXPR --stage STAGE``
    Prints one stage of the pipeline (:mod:`kadj.pipeline`) instead of the adjoint:
    ``typed`` (numba's typed IR), ``region`` (the region tree: structured loops and
    ifs), ``plan`` (the adjoint's argument layout), ``prepared`` (the region tree after
    the target's rewrites, and the analysis policy), ``facts`` (what the analysis found:
    active values, what each reversed loop records, recomputes or replays),
    ``adjoint-ir`` (the adjoint IR of every form of the adjoint, before printing),
    ``source`` (every form of the adjoint, without the disk cache) or ``tangent`` (the
    forward-mode function ``kernel.jvp`` runs).  The kernel may be
    an ``@njit`` or a ``@cuda.jit`` one (no GPU needed).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time

import numpy as np


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def _demo_kernels():
    """The demo's kernels, built on first use so that ``--help`` needs no compiler."""
    from numba import njit

    import kadj

    @kadj.differentiate
    @njit
    def heat_step(u, u_new, alpha):
        for i in range(1, u.shape[0] - 1):
            u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])

    @kadj.differentiate
    @njit
    def squared_error(u, target, loss):
        s = 0.0
        for i in range(u.shape[0]):
            d = u[i] - target[i]
            s += d * d
        loss[0] = 0.5 * s

    return heat_step, squared_error


def _simulate(heat_step, squared_error, u0, target, alpha, steps, call=None, states=None):
    """Run ``steps`` heat steps from ``u0`` and the loss; returns (states, loss).

    Each step writes its own array (``states[1:]``, allocated here unless given) whose
    boundary values stay 0 (Dirichlet), so the tape needs no snapshots.
    ``call(kernel, *args)`` runs a kernel (default: the decorated call, which records
    when a tape is active).
    """
    if call is None:
        call = lambda kernel, *args: kernel(*args)  # noqa: E731
    if states is None:
        states = [u0] + [np.zeros_like(u0) for _ in range(steps)]
    for k in range(steps):
        call(heat_step, states[k], states[k + 1], alpha)
    loss = np.zeros(1)
    call(squared_error, states[-1], target, loss)
    return states, loss


def _finite_difference_grad(heat_step, squared_error, u0, target, alpha, steps, eps):
    forward = lambda kernel, *args: kernel.forward(*args)  # noqa: E731
    grad = np.empty_like(u0)
    for k in range(u0.size):
        plus, minus = u0.copy(), u0.copy()
        plus[k] += eps
        minus[k] -= eps
        lp = _simulate(heat_step, squared_error, plus, target, alpha, steps, forward)[1][0]
        lm = _simulate(heat_step, squared_error, minus, target, alpha, steps, forward)[1][0]
        grad[k] = (lp - lm) / (2.0 * eps)
    return grad


def _median_time(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def demo(opts):
    import kadj

    heat_step, squared_error = _demo_kernels()
    rng = np.random.default_rng(opts.seed)
    n, steps, alpha = opts.n, opts.steps, 0.2
    x = np.linspace(0.0, 1.0, n)
    u0 = np.sin(np.pi * x) + 0.1 * rng.standard_normal(n)
    target = np.sin(np.pi * x) ** 2

    print(f"kadj demo: {steps} explicit heat steps on {n} points (alpha = {alpha}),")
    print("then loss = 0.5 * sum((u_final - target)**2); gradient of the loss w.r.t. u0.\n")

    with kadj.Tape() as tape:
        _, loss = _simulate(heat_step, squared_error, u0, target, alpha, steps)
    tape.backward(loss)
    grad = tape.grad(u0)
    print(f"loss = {loss[0]:.6f}, recorded {len(tape.launches)} launches\n")

    print("Generated adjoint of heat_step (heat_step.adjoint_source()):\n")
    print(heat_step.adjoint_source())

    fd = _finite_difference_grad(heat_step, squared_error, u0, target, alpha, steps, 1e-6)
    err = float(np.max(np.abs(grad - fd)) / max(float(np.max(np.abs(fd))), 1e-300))
    ok = err <= opts.tol
    print(f"gradient vs central finite differences: max relative error {err:.2e}"
          f" ({'ok' if ok else 'FAILED'}, tolerance {opts.tol:.0e})\n")

    _demo_timing(heat_step, squared_error, alpha, opts, rng)
    return 0 if ok else 1


def _demo_timing(heat_step, squared_error, alpha, opts, rng):
    """Gradient cost relative to the forward, on a larger grid (compiled already)."""
    import kadj

    n, steps, repeat = opts.time_n, opts.steps, opts.repeat
    u0 = rng.standard_normal(n)
    target = rng.standard_normal(n)

    states = [u0] + [np.zeros_like(u0) for _ in range(steps)]  # allocated once

    def forward():
        _simulate(heat_step, squared_error, u0, target, alpha, steps, states=states)

    def taped():
        with kadj.Tape() as tape:
            _, loss = _simulate(heat_step, squared_error, u0, target, alpha, steps,
                                states=states)
        return tape, loss

    tape, loss = taped()  # warm-up
    tape.backward(loss)
    tape.grad(u0)
    t_forward = _median_time(forward, repeat)
    t_record, t_backward = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        tape, loss = taped()
        t1 = time.perf_counter()
        tape.backward(loss)
        tape.grad(u0)
        t2 = time.perf_counter()
        t_record.append(t1 - t0)
        t_backward.append(t2 - t1)
    t_record, t_backward = float(np.median(t_record)), float(np.median(t_backward))

    # one kernel: adjoint call vs forward call, buffers refilled outside the timing
    u, u_new = rng.standard_normal(n), np.zeros(n)
    seeds = (rng.standard_normal(n), rng.standard_normal(n), np.zeros(1))
    work = tuple(s.copy() for s in seeds)
    heat_step.forward(u, u_new, alpha)
    heat_step.adjoint(u, u_new, alpha, *work)
    t_fwd_kernel = _median_time(lambda: heat_step.forward(u, u_new, alpha), repeat)
    times = []
    for _ in range(repeat):
        for w, s in zip(work, seeds):
            np.copyto(w, s)
        t0 = time.perf_counter()
        heat_step.adjoint(u, u_new, alpha, *work)
        times.append(time.perf_counter() - t0)
    t_adj_kernel = float(np.median(times))

    print(f"timing on {n} points, {steps} steps (median of {repeat}):")
    print(f"  forward run (steps + loss)              {t_forward * 1e3:9.3f} ms")
    print(f"  same run recorded on a kadj.Tape        {t_record * 1e3:9.3f} ms")
    print(f"  tape.backward + tape.grad               {t_backward * 1e3:9.3f} ms"
          f"   gradient/forward = {t_backward / t_forward:.2f}x")
    print(f"  heat_step.forward (one call)            {t_fwd_kernel * 1e3:9.3f} ms")
    print(f"  heat_step.adjoint (one call)            {t_adj_kernel * 1e3:9.3f} ms"
          f"   adjoint/forward  = {t_adj_kernel / t_fwd_kernel:.2f}x")


# --------------------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------------------


def _load(target):
    module_name, sep, func_name = target.rpartition(":")
    if not sep or not module_name or not func_name:
        raise SystemExit(f"kadj show: expected MODULE:FUNC, got {target!r}")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None:
            raise SystemExit(f"kadj show: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    try:
        obj = module
        for part in func_name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise SystemExit(f"kadj show: {module_name} has no attribute {func_name!r}") from None
    return obj


def show(opts):
    import kadj

    kernel = _load(opts.target)
    wrt = tuple(w for w in opts.wrt.split(",") if w) if opts.wrt else None
    if not hasattr(kernel, "adjoint_source"):
        kernel = kadj.differentiate(kernel, wrt=wrt)
    elif wrt is not None:
        raise SystemExit("kadj show: --wrt applies only to a kernel not yet differentiated")
    args = ()
    if opts.args:
        args = eval(opts.args, {"np": np, "numpy": np})  # a command-line expression
        if not isinstance(args, tuple):
            args = (args,)
    try:
        if opts.stage:
            print(kernel.show_stage(opts.stage, *args), end="")
        else:
            print(kernel.adjoint_source(*args))
    except kadj.DifferentiationError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kadj", description="kadj: adjoints of Numba kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="differentiate a heat-equation solver end to end (CPU)")
    p.add_argument("--n", type=int, default=64, help="grid points for the gradient check")
    p.add_argument("--steps", type=int, default=5, help="time steps")
    p.add_argument("--time-n", type=int, default=1_000_000, help="grid points for timing")
    p.add_argument("--repeat", type=int, default=10, help="timed repetitions")
    p.add_argument("--tol", type=float, default=1e-6, help="max relative error allowed")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=demo)

    p = sub.add_parser("show", help="print the adjoint kadj generates for a kernel")
    p.add_argument("target", metavar="MODULE:FUNC")
    p.add_argument("--args", help="example arguments, a Python expression (np in scope)")
    p.add_argument("--wrt", help="comma-separated inputs to differentiate (default: all floats)")
    p.add_argument("--stage", choices=("typed", "region", "plan", "prepared", "facts",
                                       "adjoint-ir", "source", "tangent"),
                   help="print this stage of the pipeline instead of the adjoint")
    p.set_defaults(run=show)

    opts = parser.parse_args(argv)
    return opts.run(opts)


if __name__ == "__main__":
    sys.exit(main())
