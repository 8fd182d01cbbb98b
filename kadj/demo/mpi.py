"""``python -m kadj demo --mpi``: the demo's inverse problem decomposed over MPI ranks.

Run it as ``mpiexec -n P python -m kadj demo --mpi [--quick]``.  The global grid's
interior cells are split over a ``P``-rank process grid (:class:`kadj.mpi.Halo`, one
ghost layer, walls on both axes: at the edge of the grid the ghost layers are the
fixed boundary cells).  Every objective evaluation, on every rank: the rank's block of
the diffusivity, its ghost layers filled by a recorded halo exchange; the time loop of
halo exchanges and the demo's ``diffuse`` kernel inside :func:`kadj.checkpointed_loop`;
the rank's part of the objective (:func:`local_objective`: the cells and the
neighbour pairs it owns) summed over the ranks by :func:`kadj.mpi.allreduce_sum`;
``tape.backward`` on every rank, and each rank's owned part of the gradient gathered
on rank 0.  Rank 0 runs the single-process driver (:func:`kadj.demo.solve.main`:
L-BFGS-B, finite-difference check, summary, PNG) on a model that broadcasts every
evaluation to the other ranks, which serve them until rank 0 is done.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
from numba import njit

import kadj

from .models import default_snapshots


@kadj.differentiate(wrt=("u", "kappa"))
@njit
def local_objective(u, obs, kappa, weight, beta, i0, i1, j0, j1, out):
    """The demo's objective restricted to the cells ``[i0, i1) x [j0, j1)`` of the local
    array this rank owns, and to the neighbour pairs whose lower cell it owns."""
    nx, ny = u.shape
    misfit = 0.0
    for i in range(i0, i1):
        for j in range(j0, j1):
            d = u[i, j] - obs[i, j]
            misfit += d * d
    rough = 0.0
    for i in range(i0, min(i1, nx - 1)):
        for j in range(j0, j1):
            d = kappa[i + 1, j] - kappa[i, j]
            rough += d * d
    for i in range(i0, i1):
        for j in range(j0, min(j1, ny - 1)):
            d = kappa[i, j + 1] - kappa[i, j]
            rough += d * d
    out[0] = 0.5 * weight * misfit + 0.5 * beta * rough


def warm_up(comm):
    """Compile the kernels and their adjoints on rank 0 first, on a tiny problem, while
    the other ranks wait (sleeping, not spinning); they then find them in kadj's and
    numba's caches instead of all compiling the same code at once."""
    import time

    from . import kernels_cpu

    def compile_all():
        u, v, kappa = np.zeros((4, 4)), np.zeros((4, 4)), np.ones((4, 4))
        part = np.zeros(1)
        with kadj.Tape() as tape:
            kernels_cpu.diffuse(u, v, kappa, 0.1)
            local_objective(v, u, kappa, 1.0, 1.0, 0, 4, 0, 4, part)
        tape.backward(part, wrt=[kappa])

    start = time.perf_counter()
    if comm.rank == 0:
        compile_all()
        print(f"kadj demo --mpi: compiled the kernels and their adjoints on rank 0 in "
              f"{time.perf_counter() - start:.1f} s (the other ranks load them from "
              "the caches)", flush=True)
    done = comm.Ibarrier()
    while not done.Test():
        time.sleep(0.01)
    if comm.rank != 0:
        compile_all()


def _split(n, parts):
    return [len(c) for c in np.array_split(np.arange(n), parts)]


class MpiModel:
    """The demo's model (``loss``, ``loss_and_grad`` of the global field ``x``) over
    the ranks of ``comm``: called on rank 0, it broadcasts the evaluation, which the
    other ranks run in :meth:`serve`; the results are rank 0's."""

    name = "cpu"

    def __init__(self, comm, problem, snapshots=None):
        from mpi4py import MPI

        import kadj.mpi
        from . import kernels_cpu
        self.comm, self.p, self.k = comm, problem, kernels_cpu
        self.snapshots = snapshots or default_snapshots(problem.steps)
        n = problem.n
        self.dims = tuple(MPI.Compute_dims(comm.size, 2))
        coords = np.unravel_index(comm.rank, self.dims)
        shape = tuple(_split(n - 2, p)[c] + 2 for p, c in zip(self.dims, coords))
        self.halo = kadj.mpi.Halo(comm, shape, width=1, dims=self.dims, periodic=False)
        h = self.halo
        # this rank's block in the global arrays, ghost layers included
        self.block = tuple(slice(s.start, s.stop + 2) for s in h.global_slices)
        # the local cells it owns: its interior, and the boundary cells at the walls
        self.own = tuple(
            (0 if c == 0 else 1, shape[d] if c == self.dims[d] - 1 else shape[d] - 1)
            for d, c in enumerate(coords))
        self.u0 = self._local(problem.u0)
        self.obs = self._local(problem.obs)

    def _local(self, field):
        return np.ascontiguousarray(field[self.block])

    # ---- rank 0 asks, every rank computes
    def loss(self, x):
        self._ask("loss", x)
        return self._loss(x)

    def loss_and_grad(self, x):
        self._ask("grad", x)
        return self._loss_and_grad(x)

    def _ask(self, what, x):
        if self.comm.rank == 0:
            self.comm.bcast((what, np.asarray(x, dtype=np.float64)), root=0)

    def stop(self):
        """Rank 0: release the ranks in :meth:`serve`."""
        if self.comm.rank == 0:
            self.comm.bcast(None, root=0)

    def serve(self):
        """Ranks other than 0: run rank 0's evaluations until it stops."""
        while True:
            request = self.comm.bcast(None, root=0)
            if request is None:
                return
            what, x = request
            (self._loss if what == "loss" else self._loss_and_grad)(x)

    # ---- the evaluation on this rank
    def _run(self, kappa):
        p, k, halo = self.p, self.k, self.halo
        halo.exchange(kappa)
        u, v = self.u0.copy(), np.zeros_like(self.u0)

        def step(i, u, v):
            halo.exchange(u)
            k.diffuse(u, v, kappa, p.r)
            return v, u

        u, v = kadj.checkpointed_loop(step, (u, v), steps=p.steps,
                                      snapshots=self.snapshots)
        part, out = np.zeros(1), np.zeros(1)
        (i0, i1), (j0, j1) = self.own
        local_objective(u, self.obs, kappa, p.weight, p.beta, i0, i1, j0, j1, part)
        kadj.mpi.allreduce_sum(self.comm, part, out)
        return out

    def _kappa(self, x):
        x = np.asarray(x, dtype=np.float64).reshape(self.p.n, self.p.n)
        return self._local(x)

    def _loss(self, x):
        return float(self._run(self._kappa(x))[0])

    def _loss_and_grad(self, x):
        kappa = self._kappa(x)
        with kadj.Tape() as tape:
            out = self._run(kappa)
        tape.backward(out, wrt=[kappa])
        (i0, i1), (j0, j1) = self.own
        mine = np.asarray(tape.grad(kappa))[i0:i1, j0:j1].copy()
        where = (self.block[0].start + i0, self.block[1].start + j0)
        parts = self.comm.gather((where, mine), root=0)
        if parts is None:
            return float(out[0]), None
        g = np.zeros((self.p.n, self.p.n))
        for (a, b), part in parts:
            g[a:a + part.shape[0], b:b + part.shape[1]] = part
        return float(out[0]), g.ravel()


def run(opts):
    """The ``--mpi`` demo on every rank; the exit status (rank 0's, told to all)."""
    if importlib.util.find_spec("mpi4py") is None:
        print("kadj demo --mpi needs mpi4py and an MPI library: pip install "
              "\"kadj[mpi]\" (mpi4py and the mpich wheels), then run it as "
              "mpiexec -n 4 python -m kadj demo --mpi", file=sys.stderr)
        return 2
    if opts.device == "cuda":
        print("kadj demo --mpi runs the CPU kernels (--device cpu).", file=sys.stderr)
        return 2
    from mpi4py import MPI

    from . import deps, solve
    from .problem import make_problem
    comm = MPI.COMM_WORLD
    if deps.missing():                           # the same on every rank
        return solve.main(opts) if comm.rank == 0 else 2
    warm_up(comm)
    opts.device = "cpu"
    if comm.rank != 0:
        opts.no_progress = True
        try:
            problem = make_problem(opts.size, opts.steps, noise=opts.noise,
                                   seed=opts.seed)
        except ValueError:
            return comm.bcast(None, root=0)      # rank 0 says why
        model = MpiModel(comm, problem, opts.snapshots)
        model.serve()
        return comm.bcast(None, root=0)
    made = []

    def make(device, problem, snapshots):
        made.append(MpiModel(comm, problem, snapshots))
        m = made[0]
        print(f"kadj demo --mpi: {comm.size} ranks, process grid {m.dims}, this "
              f"rank's block {m.halo.shape} cells (ghost layers included)")
        return m

    status = 2
    try:
        status = solve.main(opts, make=make)
    except BaseException:
        comm.Abort(1)                            # the other ranks wait on rank 0
        raise
    finally:
        if made:
            made[0].stop()
    return comm.bcast(status, root=0)
