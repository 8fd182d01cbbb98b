"""The demo's inverse problem: recover the diffusivity ``kappa(x, y)`` of a 2-D heat
equation from a noisy observation of the final temperature.

The forward model starts from a known temperature ``u0`` (a few smooth modes, zero on
the boundary), takes ``steps`` explicit steps of ``u_t = div(kappa grad u)``
(:mod:`kadj.demo.kernels_cpu`) and compares the result with the observation.  The
objective adds a smoothness penalty on ``kappa``; it is minimised over ``kappa`` within
bounds that keep the explicit scheme stable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KAPPA_BACKGROUND = 1.0
KAPPA_BOUNDS = (0.25, 3.0)
R = 0.07  # r * max(kappa) * 4 <= 1: the explicit scheme is stable within the bounds


@dataclass(frozen=True)
class Problem:
    """Everything the forward model and the optimiser need (arrays are float64)."""
    n: int                  # cells per side
    steps: int              # explicit time steps
    r: float                # time step / cell size**2
    u0: np.ndarray          # known initial temperature (n, n)
    kappa_true: np.ndarray  # the field to recover (n, n)
    kappa_start: np.ndarray  # the optimiser's starting guess (n, n)
    obs: np.ndarray         # noisy final temperature (n, n)
    noise: float            # standard deviation of the observation noise
    weight: float           # misfit weight, 1 / (noise**2 * cells)
    beta: float             # smoothness weight
    bounds: tuple           # (low, high) for every kappa value

    def relative_error(self, kappa):
        """||kappa - kappa_true|| / ||kappa_true - kappa_start|| (1 at the start)."""
        kappa = np.asarray(kappa).reshape(self.kappa_true.shape)
        return float(np.linalg.norm(kappa - self.kappa_true)
                     / np.linalg.norm(self.kappa_true - self.kappa_start))


def true_kappa(n):
    """A background diffusivity with a conductive blob and a resistive inclusion."""
    x = (np.arange(n) + 0.5) / n
    X, Y = np.meshgrid(x, x, indexing="ij")
    blob = np.exp(-((X - 0.35) ** 2 + (Y - 0.38) ** 2) / (2 * 0.11 ** 2))
    inclusion = np.exp(-((X - 0.70) ** 2 + (Y - 0.68) ** 2) / (2 * 0.08 ** 2))
    return KAPPA_BACKGROUND + 1.2 * blob - 0.55 * inclusion


def initial_temperature(n):
    """Smooth modes of several orientations, zero on the boundary."""
    x = (np.arange(n) + 0.5) / n
    X, Y = np.meshgrid(x, x, indexing="ij")
    u0 = (np.sin(3 * np.pi * X) * np.sin(2 * np.pi * Y)
          + 0.7 * np.sin(2 * np.pi * X) * np.sin(5 * np.pi * Y)
          + 0.5 * np.sin(5 * np.pi * X) * np.sin(3 * np.pi * Y))
    u0[0, :] = u0[-1, :] = u0[:, 0] = u0[:, -1] = 0.0
    return np.ascontiguousarray(u0)


def simulate_numpy(u0, kappa, r, steps):
    """Reference forward model in NumPy (used only to make the observation)."""
    u = u0.copy()
    for _ in range(steps):
        kc = kappa[1:-1, 1:-1]
        uc = u[1:-1, 1:-1]
        flux = ((kc + kappa[2:, 1:-1]) * (u[2:, 1:-1] - uc)
                - (kc + kappa[:-2, 1:-1]) * (uc - u[:-2, 1:-1])
                + (kc + kappa[1:-1, 2:]) * (u[1:-1, 2:] - uc)
                - (kc + kappa[1:-1, :-2]) * (uc - u[1:-1, :-2]))
        v = u.copy()
        v[1:-1, 1:-1] = uc + 0.5 * r * flux
        u = v
    return u


def make_problem(n=128, steps=200, noise=0.01, beta=None, seed=0):
    """The problem on an ``n`` x ``n`` grid with ``steps`` time steps; ``noise`` is
    relative to the largest final temperature."""
    if n < 8:
        raise ValueError(f"the demo needs at least 8 cells per side, not {n}")
    if steps < 1:
        raise ValueError(f"the demo needs at least one time step, not {steps}")
    rng = np.random.default_rng(seed)
    u0 = initial_temperature(n)
    kappa_true = true_kappa(n)
    clean = simulate_numpy(u0, kappa_true, R, steps)
    sigma = noise * float(np.max(np.abs(clean)))
    obs = clean + sigma * rng.standard_normal(clean.shape)
    weight = 1.0 / (max(sigma, 1e-12) ** 2 * n * n)
    if beta is None:
        beta = 1e-2
    return Problem(n=n, steps=steps, r=R, u0=u0, kappa_true=kappa_true,
                   kappa_start=np.full((n, n), KAPPA_BACKGROUND), obs=obs, noise=sigma,
                   weight=weight, beta=beta, bounds=KAPPA_BOUNDS)
