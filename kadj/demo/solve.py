"""The demo's driver: set up the problem, check one gradient against finite
differences, minimise with L-BFGS-B on kadj gradients, print a summary, write the PNG."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from . import deps
from ..timing import median_time

FD_TOL = 1e-5   # largest relative error allowed between kadj's and the FD derivative
FD_EPS = 1e-4   # step of the central difference, along a unit direction


def pick_device(requested):
    """"cpu" or "cuda" for --device auto|cpu|cuda."""
    if requested == "cpu":
        return "cpu"
    from numba import cuda
    available = cuda.is_available()
    if requested == "cuda":
        if not available:
            raise SystemExit("kadj demo: --device cuda, but numba.cuda.is_available() is "
                             "False (no GPU or driver; NUMBA_ENABLE_CUDASIM=1 runs the "
                             "simulator)")
        return "cuda"
    return "cuda" if available else "cpu"


def fd_check(model, x, grad, rng):
    """(kadj's directional derivative, central difference, relative error) along a
    random unit direction at ``x``, the objective evaluated in float64."""
    d = rng.standard_normal(x.size)
    d /= np.linalg.norm(d)
    exact = float(grad @ d)
    fd = (model.loss(x + FD_EPS * d) - model.loss(x - FD_EPS * d)) / (2.0 * FD_EPS)
    err = abs(exact - fd) / max(abs(exact), abs(fd), 1e-300)
    return exact, fd, err


class Objective:
    """The function L-BFGS-B calls: objective and kadj gradient, timed."""

    def __init__(self, model):
        self.model = model
        self.calls = 0
        self.seconds = 0.0
        self.last = None

    def __call__(self, x):
        t0 = time.perf_counter()
        f, g = self.model.loss_and_grad(x)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.last = f
        return f, g


def main(opts, make=None):
    """The demo; ``make(device, problem, snapshots)``: the model (default
    :func:`kadj.demo.models.make_model`)."""
    names = deps.missing()
    if names:
        print(deps.message(names), file=sys.stderr)
        return 2
    from scipy.optimize import minimize

    from .models import make_model
    from .plot import save_figure
    from .problem import make_problem
    from .progress import Progress

    t_start = time.perf_counter()
    device = pick_device(opts.device)
    try:
        problem = make_problem(opts.size, opts.steps, noise=opts.noise, seed=opts.seed)
    except ValueError as exc:
        print(f"kadj demo: {exc}", file=sys.stderr)
        return 2
    model = (make or make_model)(device, problem, opts.snapshots)
    n, steps = problem.n, problem.steps
    print(f"kadj demo: recover the diffusivity kappa(x, y) of u_t = div(kappa grad u) on "
          f"{n}x{n} cells")
    print(f"  from the temperature after {steps} explicit steps, observed with "
          f"{opts.noise:.0%} noise; device: {device}")
    print(f"  gradients: kadj adjoints on a kadj.Tape, time loop in "
          f"kadj.checkpointed_loop ({model.snapshots} snapshots)")

    x0 = problem.kappa_start.ravel().copy()
    t0 = time.perf_counter()
    f0, g0 = model.loss_and_grad(x0)          # compiles the kernels and their adjoints
    t_compile = time.perf_counter() - t0
    print(f"  compiled the kernels and their adjoints in {t_compile:.1f} s; "
          f"starting loss {f0:.4e}")

    rng = np.random.default_rng(opts.seed + 1)
    exact, fd, fd_err = fd_check(model, x0, g0, rng)
    fd_ok = bool(np.isfinite(fd_err) and fd_err <= FD_TOL)

    objective = Objective(model)
    losses, errors = [f0], [problem.relative_error(x0)]
    bar = Progress(opts.iters, enabled=not opts.no_progress)

    def callback(xk):
        losses.append(objective.last)
        errors.append(problem.relative_error(xk))
        bar.update(losses[-1], errors[-1])

    try:
        res = minimize(objective, x0, jac=True, method="L-BFGS-B",
                       bounds=[problem.bounds] * x0.size, callback=callback,
                       options={"maxiter": opts.iters})
    finally:
        bar.close()
    kappa = res.x.reshape(n, n)
    t_grad = objective.seconds / max(objective.calls, 1)
    t_forward = median_time(lambda: model.loss(res.x))

    print("\nsummary")
    print(f"  iterations               {res.nit} ({objective.calls} gradient evaluations; "
          f"{res.message if isinstance(res.message, str) else res.message.decode()})")
    print(f"  loss                     {f0:.4e} -> {float(res.fun):.4e}")
    print(f"  relative error of kappa  {errors[0]:.3f} -> {problem.relative_error(kappa):.3f}"
          f"   (||kappa - kappa_true|| / ||kappa_start - kappa_true||)")
    print(f"  gradient time / forward  {t_grad * 1e3:.1f} ms / {t_forward * 1e3:.1f} ms = "
          f"{t_grad / t_forward:.1f}x")
    print(f"  finite-difference check  directional derivative {exact:.6e} (kadj) vs "
          f"{fd:.6e} (central FD):")
    print(f"                           relative error {fd_err:.1e} "
          f"({'ok' if fd_ok else 'FAILED'}, tolerance {FD_TOL:.0e})")

    path = os.path.abspath(opts.output)
    save_figure(path, problem, kappa, losses, errors,
                f"kadj demo: diffusivity from the final temperature ({n}x{n} cells, "
                f"{steps} steps, {device})")
    print(f"  picture                  {path}")
    print(f"  wall time                {time.perf_counter() - t_start:.1f} s")
    return 0 if fd_ok else 1
