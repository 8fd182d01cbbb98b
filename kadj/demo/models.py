"""The forward model and its kadj gradient on each device.

A model evaluates the objective of a :class:`kadj.demo.problem.Problem` for a
diffusivity field (``loss``), or the objective and its gradient with respect to the
field (``loss_and_grad``): the time loop runs inside :func:`kadj.checkpointed_loop` on
a :class:`kadj.Tape` (at most ``snapshots`` copies of the temperature held), and the
gradient comes from ``tape.backward``, i.e. from the adjoints kadj generates for the
kernels.  ``CpuModel`` runs the ``@njit`` kernels on NumPy arrays, ``CudaModel`` the
``@cuda.jit`` kernels on device arrays.
"""
from __future__ import annotations

import numpy as np

import kadj


def default_snapshots(steps):
    """About sqrt(steps) snapshots: a few recomputations per step, little memory."""
    return max(2, min(steps, int(round(steps ** 0.5))))


class CpuModel:
    name = "cpu"

    def __init__(self, problem, snapshots=None):
        from . import kernels_cpu
        self.p = problem
        self.k = kernels_cpu
        self.snapshots = snapshots or default_snapshots(problem.steps)

    def _field(self, x):
        return np.ascontiguousarray(np.asarray(x, dtype=np.float64)
                                    .reshape(self.p.n, self.p.n)).copy()

    def _run(self, kappa):
        p, k = self.p, self.k
        u, v = p.u0.copy(), np.zeros_like(p.u0)

        def step(i, u, v):
            k.diffuse(u, v, kappa, p.r)
            return v, u

        u, v = kadj.checkpointed_loop(step, (u, v), steps=p.steps, snapshots=self.snapshots)
        out = np.zeros(1)
        k.objective(u, p.obs, kappa, p.weight, p.beta, out)
        return out

    def loss(self, x):
        return float(self._run(self._field(x))[0])

    def loss_and_grad(self, x):
        kappa = self._field(x)
        with kadj.Tape() as tape:
            out = self._run(kappa)
        tape.backward(out, wrt=[kappa])
        return float(out[0]), np.asarray(tape.grad(kappa)).ravel()


class CudaModel:
    name = "cuda"

    def __init__(self, problem, snapshots=None):
        from numba import cuda

        from . import kernels_cuda
        self.cuda = cuda
        self.p = problem
        self.k = kernels_cuda
        self.snapshots = snapshots or default_snapshots(problem.steps)
        self.config = kernels_cuda.launch_config(problem.u0.shape)
        self.d_u0 = cuda.to_device(problem.u0)
        self.d_obs = cuda.to_device(problem.obs)

    def _run(self, d_kappa):
        cuda, p, k = self.cuda, self.p, self.k
        blocks, threads = self.config
        d_u = cuda.device_array_like(self.d_u0)
        d_u.copy_to_device(self.d_u0)
        d_v = cuda.to_device(np.zeros_like(p.u0))

        def step(i, u, v):
            k.diffuse[blocks, threads](u, v, d_kappa, p.r)
            return v, u

        d_u, d_v = kadj.checkpointed_loop(step, (d_u, d_v), steps=p.steps,
                                          snapshots=self.snapshots)
        out = cuda.to_device(np.zeros(1))
        k.objective[blocks, threads](d_u, self.d_obs, d_kappa, p.weight, p.beta, out)
        return out

    def _field(self, x):
        kappa = np.ascontiguousarray(np.asarray(x, dtype=np.float64)
                                     .reshape(self.p.n, self.p.n))
        return self.cuda.to_device(kappa)

    def loss(self, x):
        return float(self._run(self._field(x)).copy_to_host()[0])

    def loss_and_grad(self, x):
        d_kappa = self._field(x)
        with kadj.Tape() as tape:
            out = self._run(d_kappa)
        tape.backward(out, wrt=[d_kappa])
        g = tape.grad(d_kappa)
        g = g.copy_to_host() if hasattr(g, "copy_to_host") else np.asarray(g)
        return float(out.copy_to_host()[0]), g.ravel()


def make_model(device, problem, snapshots=None):
    """The model for ``device`` ("cpu" or "cuda")."""
    if device == "cuda":
        return CudaModel(problem, snapshots)
    return CpuModel(problem, snapshots)
