"""Halo exchanges on an N-D Cartesian decomposition, with their adjoint.

The local array of each rank holds its part of the global field (the *interior*)
surrounded, along each axis of nonzero width ``w``, by ``w`` ghost layers on each side.
:meth:`Halo.exchange` fills the ghost layers from the neighbours' interiors, one axis
after the other (axis 0 first; the slabs sent along an axis span the other axes'
ghost layers too, so corners are filled).  Along an axis without a neighbour (the edge
of a non-periodic axis) the ghost layers are left as they are: they hold the boundary
condition.  A periodic axis that is not split wraps the rank's own interior around.

The adjoint is the transpose, axis by axis in reverse order: each ghost layer's
cotangent is sent back to the rank that filled it and added into the interior slab it
came from, then the ghost cotangent is zeroed.  Device arrays are staged through the
host (the whole array per exchange; CUDA-aware transfers are not used).
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .. import arrays
from ..errors import DifferentiationError
from . import replay_check, steps

__all__ = ["Halo"]


class Halo:
    """Ghost-layer exchanges of local arrays of shape ``shape`` over ``comm``.

    ``shape``: this rank's local array shape, ghost layers included (it may differ
    between ranks: uneven decompositions).  ``width``: ghost layers per side, an int or
    one per axis (0: no ghost layers along that axis).  ``dims``: ranks per axis (the
    product is ``comm.size``; missing trailing axes count 1; None: ``MPI.Compute_dims``).
    ``periodic``: a bool or one per axis.  Rank ``r`` of ``comm`` gets the Cartesian
    coordinates ``halo.coords`` (row-major over ``dims``; ranks are not reordered).
    Construction is collective over ``comm``.

    Attributes: ``comm`` (the Cartesian communicator), ``coords``, ``neighbors`` (per
    axis the low and high neighbour's rank, ``MPI.PROC_NULL`` at a wall),
    ``interior`` (the index of this rank's interior in its local array),
    ``global_shape`` (the global field, ghost layers excluded), ``global_slices``
    (this rank's interior in it), ``timings`` (``{"forward": [count, seconds],
    "adjoint": [count, seconds]}`` of the exchanges run so far; recomputed steps of a
    checkpointed loop count as forward exchanges).  A Halo keeps views of the last four
    NumPy arrays it exchanged (so those stay alive) and one set of message buffers.
    """

    def __init__(self, comm, shape, width=1, dims=None, periodic=False):
        shape = tuple(int(n) for n in shape)
        ndim = len(shape)
        if dims is None:
            dims = MPI.Compute_dims(comm.size, ndim)
        dims = _fill(dims, ndim, 1, "dims")
        self.width = _fill(width, ndim, None, "width")
        self.periodic = _fill(periodic, ndim, None, "periodic", bool)
        if int(np.prod(dims)) != comm.size:
            raise ValueError(
                f"Halo got dims={dims}, whose product is not the number of ranks "
                f"({comm.size}).")
        self.shape, self.dims, self.ndim = shape, dims, ndim
        self.comm = comm.Create_cart(list(dims), list(self.periodic), reorder=False)
        self.index = replay_check.register(self.comm)
        self.coords = tuple(self.comm.Get_coords(self.comm.rank))
        self.neighbors = tuple(self.comm.Shift(d, 1) for d in range(ndim))  # (lo, hi)
        self._null = MPI.PROC_NULL
        self._buffers = {}       # (axis, dtype) -> message buffers
        self._views = {}         # id(array) -> (array, its plan), the last few
        #: exchanges run so far: {"forward": [count, seconds], "adjoint": [...]}
        #: (recomputations of checkpointed steps count as forward exchanges)
        self.timings = {"forward": [0, 0.0], "adjoint": [0, 0.0]}
        self._geometry(self.comm.allgather((self.coords, shape)))

    def _geometry(self, everyone):
        """Check the decomposition (each axis' size a function of that axis' coordinate,
        interiors at least as wide as the ghost layers) and place this rank's interior
        in the global field."""
        sizes = [dict() for _ in range(self.ndim)]
        for rank, (coords, shape) in enumerate(everyone):
            if len(shape) != self.ndim:
                raise ValueError(f"Halo: rank {rank} has a {len(shape)}-D shape "
                                 f"{shape}, this rank a {self.ndim}-D one.")
            for d in range(self.ndim):
                inner = shape[d] - 2 * self.width[d]
                if inner < max(1, self.width[d]):
                    raise ValueError(
                        f"Halo: rank {rank}'s local shape {shape} leaves {inner} "
                        f"interior cells along axis {d}, fewer than the ghost width "
                        f"{self.width[d]}; use fewer ranks along that axis.")
                if sizes[d].setdefault(coords[d], inner) != inner:
                    raise ValueError(
                        f"Halo: ranks at coordinate {coords[d]} along axis {d} have "
                        f"different interior sizes ({sizes[d][coords[d]]} and {inner}, "
                        f"rank {rank}); the decomposition must be a product of one "
                        "split per axis.")
        self.global_shape = tuple(sum(s.values()) for s in sizes)
        self.global_slices = tuple(
            slice(sum(sizes[d][c] for c in range(self.coords[d])),
                  sum(sizes[d][c] for c in range(self.coords[d] + 1)))
            for d in range(self.ndim))
        self.interior = tuple(slice(w, n - w) for n, w in zip(self.shape, self.width))

    # ------------------------------------------------------------------ exchange
    def exchange(self, u):
        """Fill ``u``'s ghost layers from the neighbours (collective over the ranks).

        On an active :class:`kadj.Tape` (or in a :func:`kadj.checkpointed_loop` step)
        the exchange is recorded with its adjoint, the reversed exchange with
        accumulation; without a tape it just communicates.  ``u``: a NumPy array, or a
        device array (staged through the host) of the Halo's shape."""
        self._check(u)

        def forward():
            start = time.perf_counter()
            h = steps.staged(u)
            self._forward(h, h is u)
            steps.store(u, h)
            self._count("forward", start)

        def adjoint(adj_u):
            if adj_u is None:
                return
            start = time.perf_counter()
            h = steps.staged(adj_u)
            self._adjoint(h, h is adj_u)
            steps.store(adj_u, h)
            self._count("adjoint", start)

        steps.run(self.index, "exchange", forward, adjoint, (u,), (u,),
                  "halo_exchange")

    def _count(self, which, start):
        t = self.timings[which]
        t[0] += 1
        t[1] += time.perf_counter() - start

    def _check(self, u):
        if not arrays.is_array(u):
            raise DifferentiationError(
                f"halo.exchange takes an array, but got {arrays.describe(u)}.")
        if tuple(u.shape) != self.shape:
            raise DifferentiationError(
                f"halo.exchange got an array of shape {tuple(u.shape)}; this Halo was "
                f"made for local arrays of shape {self.shape} (ghost layers included).")

    def _plan(self, a, cache=True):
        """Per exchanged axis: ``(d, views, buffers)``, ``views`` the low and high
        ghost layers and interior slabs sent of array ``a`` (kept for the last few
        arrays: a tape's buffers come back at every step), ``buffers`` four message
        buffers of ``a``'s dtype (reused: one exchange at a time)."""
        hit = self._views.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        plan = []
        for d in range(self.ndim):
            w, n = self.width[d], self.shape[d]
            if w == 0:
                continue

            def slab(start, stop):
                index = [slice(None)] * self.ndim
                index[d] = slice(start, stop)
                return a[tuple(index)]
            key = (d, np.dtype(a.dtype).str)
            if key not in self._buffers:
                shape = list(self.shape)
                shape[d] = w
                self._buffers[key] = tuple(np.empty(shape, a.dtype) for _ in range(4))
            plan.append((d, (slab(0, w), slab(n - w, n), slab(w, 2 * w),
                             slab(n - 2 * w, n - w)), self._buffers[key]))
        if cache:
            if len(self._views) >= 4:
                self._views.pop(next(iter(self._views)))
            self._views[id(a)] = (a, plan)
        return plan

    def _forward(self, h, cache=True):
        """Along each axis: my low interior slab goes down (into the low neighbour's
        high ghosts), my high one up; the neighbours' arrive in my ghost layers."""
        comm, null = self.comm, self._null
        for d, views, buffers in self._plan(h, cache):
            ghost_lo, ghost_hi, slab_lo, slab_hi = views
            out_lo, out_hi, in_lo, in_hi = buffers
            lo, hi = self.neighbors[d]
            down, up = 4 * d, 4 * d + 1
            requests = []
            if lo != null:
                requests.append(comm.Irecv(in_lo, source=lo, tag=up))
                np.copyto(out_lo, slab_lo)
                requests.append(comm.Isend(out_lo, dest=lo, tag=down))
            if hi != null:
                requests.append(comm.Irecv(in_hi, source=hi, tag=down))
                np.copyto(out_hi, slab_hi)
                requests.append(comm.Isend(out_hi, dest=hi, tag=up))
            MPI.Request.Waitall(requests)
            if lo != null:
                np.copyto(ghost_lo, in_lo)
            if hi != null:
                np.copyto(ghost_hi, in_hi)

    def _adjoint(self, g, cache=True):
        """The transpose, axes in reverse order: each ghost layer's cotangent goes back
        to the rank it came from and is added into the slab it was copied from."""
        comm, null = self.comm, self._null
        for d, views, buffers in reversed(self._plan(g, cache)):
            ghost_lo, ghost_hi, slab_lo, slab_hi = views
            out_lo, out_hi, in_lo, in_hi = buffers
            lo, hi = self.neighbors[d]
            down, up = 4 * d + 2, 4 * d + 3     # the directions the cotangents travel
            requests = []
            if lo != null:      # my low ghosts came up from lo: send them back down
                requests.append(comm.Irecv(in_lo, source=lo, tag=up))
                np.copyto(out_lo, ghost_lo)
                requests.append(comm.Isend(out_lo, dest=lo, tag=down))
            if hi != null:
                requests.append(comm.Irecv(in_hi, source=hi, tag=down))
                np.copyto(out_hi, ghost_hi)
                requests.append(comm.Isend(out_hi, dest=hi, tag=up))
            MPI.Request.Waitall(requests)
            if lo != null:
                ghost_lo.fill(0)
                np.add(slab_lo, in_lo, out=slab_lo)
            if hi != null:
                ghost_hi.fill(0)
                np.add(slab_hi, in_hi, out=slab_hi)

    # --------------------------------------------------------------- diagnostics
    def local_part(self, field):
        """This rank's interior of a global field (an array of ``global_shape``
        present on every rank), as a view."""
        return field[self.global_slices]

    def gather(self, u, root=0):
        """The global field assembled from every rank's interior of ``u``: a NumPy
        array of ``global_shape`` on ``root``, None on the other ranks.  Collective;
        not recorded and not differentiated (for diagnostics and tests)."""
        mine = np.ascontiguousarray(arrays.to_host(u)[self.interior])
        parts = self.comm.gather((self.global_slices, mine), root=root)
        if parts is None:
            return None
        out = np.empty(self.global_shape, mine.dtype)
        for where, part in parts:
            out[where] = part
        return out

    def __repr__(self):
        return (f"Halo(rank {self.comm.rank} at {self.coords} of dims {self.dims}, "
                f"local shape {self.shape}, width {self.width}, periodic "
                f"{self.periodic}, global shape {self.global_shape})")


def _fill(value, ndim, pad, what, kind=int):
    """One value per axis: a scalar for every axis, or a tuple padded with ``pad``."""
    if isinstance(value, (list, tuple)):
        value = tuple(kind(v) for v in value)
        if len(value) > ndim or (pad is None and len(value) != ndim):
            raise ValueError(f"Halo got {what}={value} for a {ndim}-D array; give one "
                             f"value per axis.")
        return value + tuple(kind(pad) for _ in range(ndim - len(value)))
    if what == "dims":
        raise ValueError("Halo's dims must list the ranks per axis, e.g. dims=(2, 2).")
    return (kind(value),) * ndim
