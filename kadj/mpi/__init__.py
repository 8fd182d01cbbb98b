"""Gradients of domain-decomposed programs over MPI (mpi4py): halo exchanges and
reductions recorded on a :class:`kadj.Tape` with their adjoints.

::

    from mpi4py import MPI
    import kadj, kadj.mpi

    halo = kadj.mpi.Halo(MPI.COMM_WORLD, shape=u.shape, width=1, dims=(2, 2),
                         periodic=(False, True))
    with kadj.Tape() as tape:
        halo.exchange(u)                        # recorded, with its adjoint
        heat(u, v, 0.1)                         # each rank's own launch
        local_loss(v, target, part)
        kadj.mpi.allreduce_sum(MPI.COMM_WORLD, part, loss)
    tape.backward(loss)                         # on every rank
    g = tape.grad(u)                            # this rank's part of the gradient

Modules: :mod:`kadj.mpi.halo` (exchanges), :mod:`kadj.mpi.host_slabs` (their fused
loops over strided slabs), :mod:`kadj.mpi.device_slabs` (exchanges of device arrays:
slab kernels, host staging or CUDA-aware MPI), :mod:`kadj.mpi.reduce` (allreduce,
gather),
:mod:`kadj.mpi.steps` (communicating tape steps), :mod:`kadj.mpi.replay_check` (every
rank replays the same communication, or every rank raises).  Needs mpi4py
(``pip install "kadj[mpi]"``).
"""
from __future__ import annotations

try:
    import mpi4py  # noqa: F401
except ImportError as e:      # pragma: no cover - depends on the installation
    raise ImportError(
        "kadj.mpi needs mpi4py and an MPI library: pip install 'kadj[mpi]' (mpi4py and "
        "the mpich wheels), or mpi4py built against your cluster's MPI.") from e

from .halo import Halo
from .reduce import allreduce_max, allreduce_min, allreduce_sum, gather
from .replay_check import local

__all__ = ["Halo", "allreduce_max", "allreduce_min", "allreduce_sum", "gather", "local"]
