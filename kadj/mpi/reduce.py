"""Reductions over ranks, recorded with their adjoints, and gather for diagnostics.

The output of an allreduce is one value held by every rank.  Its cotangent is taken to
be the mean over the ranks of the cotangents they hold, so that every rank seeding the
reduced loss with 1.0 (the usual SPMD program) differentiates that one loss, as if one
rank had seeded it; cotangents of arrays each rank holds alone (its part of a field)
add up over the ranks, as the exchanges' adjoints do.  The adjoint of a sum sends that
cotangent to every rank's input (one sum-allreduce of the cotangents); that of a max
or min sends it to the winning element of the winning rank (ties: the lowest rank).
"""
from __future__ import annotations

import numpy as np

from .. import arrays
from ..errors import DifferentiationError
from . import replay_check, steps

__all__ = ["allreduce_max", "allreduce_min", "allreduce_sum", "gather"]


def allreduce_sum(comm, x, out=None):
    """``out[...] = sum over ranks of x`` (collective); returns ``out``.

    ``x``: an array (a 1-element array for a scalar), or a Python number (then the sum
    is returned, not recorded).  ``out``: an array of ``x``'s shape and dtype (made
    when omitted; it may be ``x`` itself).  Recorded on an active tape with its adjoint
    (module docstring for the convention on the cotangent of ``out``)."""
    return _allreduce(comm, x, out, "sum")


def allreduce_max(comm, x, out=None):
    """``out[...] = max over ranks of x``, element by element; see
    :func:`allreduce_sum`.  The gradient goes to the rank holding the maximum (the
    lowest such rank on a tie)."""
    return _allreduce(comm, x, out, "max")


def allreduce_min(comm, x, out=None):
    """``out[...] = min over ranks of x``, element by element; see
    :func:`allreduce_max`."""
    return _allreduce(comm, x, out, "min")


def gather(comm, x, root=0):
    """The list of every rank's ``x`` (host copies of arrays, in rank order) on
    ``root``, None elsewhere.  Collective; not recorded and not differentiated: for
    diagnostics (a field on the tape that is gathered is not changed by the gather)."""
    replay_check.signature(replay_check.register(comm), "gather")
    if arrays.is_array(x):
        x = np.array(arrays.to_host(x))
    return comm.gather(x, root=root)


def _allreduce(comm, x, out, op):
    from mpi4py import MPI
    index = replay_check.register(comm)
    mpi_op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    if not arrays.is_array(x):
        replay_check.signature(index, op)
        return comm.allreduce(x, op=mpi_op)
    if out is None:
        out = arrays.zeros_like(x)
    if tuple(out.shape) != tuple(x.shape) or np.dtype(out.dtype) != np.dtype(x.dtype):
        raise DifferentiationError(
            f"allreduce_{op} needs out of x's shape and dtype; got x "
            f"{arrays.describe(x)} and out {arrays.describe(out)}.")
    if np.dtype(x.dtype).kind == "c" and op != "sum":
        raise DifferentiationError(f"allreduce_{op} of complex values is not defined.")
    same = out is x
    state = {}

    def forward():
        h = np.ascontiguousarray(arrays.to_host(x))
        total = np.empty_like(h)
        comm.Allreduce(h, total, op=mpi_op)
        if op != "sum":   # who wins each element: the lowest rank holding the extremum
            candidate = np.where(h == total, comm.rank, comm.size).astype(np.int64)
            winner = np.empty_like(candidate)
            comm.Allreduce(candidate, winner, op=MPI.MIN)
            state["mine"] = winner == comm.rank
        steps.store(out, total if arrays.kind(out) != "host" else _into(out, total))

    def adjoint(*adj):
        adj_x, adj_out = (adj[0], adj[0]) if same else adj
        if adj_out is None:
            return
        g = np.ascontiguousarray(arrays.to_host(adj_out), dtype=adj_out.dtype)
        mean = np.empty_like(g)
        comm.Allreduce(g, mean, op=MPI.SUM)
        mean /= comm.size
        if op != "sum":
            mean = np.where(state["mine"], mean, 0)
        if same:
            steps.store(adj_x, _into(steps.staged(adj_x), mean))
        else:
            h = steps.staged(adj_out)
            h[...] = 0
            steps.store(adj_out, h)
            if adj_x is not None:
                h = steps.staged(adj_x)
                h += mean
                steps.store(adj_x, h)

    steps.run(index, op, forward, adjoint, (x,), (out,), f"allreduce_{op}")
    return out


def _into(a, values):
    a[...] = values
    return a
