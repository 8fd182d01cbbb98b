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
came from, then the ghost cotangent is zeroed.

Cost: the index of every slab is computed once per Halo, the views of an array once
per array (kept for the last four arrays); slabs that are contiguous (along axis 0 of
a C-contiguous array) are sent from and received into the array itself, others go
through one preallocated buffer per neighbour.  A periodic axis that is not split
copies within the array, without messages, and the adjoint's passes over strided
slabs are fused (:mod:`kadj.mpi.host_slabs`): one pass per ghost layer, as in the
forward.  Waits yield the core between tests instead of spinning (ranks sharing
cores).  Device arrays: :mod:`kadj.mpi.device_slabs`.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
from mpi4py import MPI

from .. import arrays
from ..errors import DifferentiationError
from . import host_slabs, replay_check, steps

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
    (this rank's interior in it), ``timings`` (``{"forward": [count, seconds,
    waiting], "adjoint": [...]}`` of the exchanges run so far, ``waiting`` the part of
    ``seconds`` spent waiting for the neighbours' messages, which includes any lag of
    a neighbour behind this rank; recomputed steps of a checkpointed loop count as
    forward exchanges), ``samples`` (None, or set it to ``{"forward": [], "adjoint":
    []}`` to collect ``(seconds, waiting)`` of each exchange).  A Halo keeps views of
    the last four NumPy arrays it exchanged (so those stay alive) and one set of
    message buffers per axis and dtype.
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
        #: exchanges run so far: {"forward": [count, seconds, waiting], "adjoint":
        #: [...]} (recomputations of checkpointed steps count as forward exchanges)
        self.timings = {"forward": [0, 0.0, 0.0], "adjoint": [0, 0.0, 0.0]}
        #: None, or {"forward": [], "adjoint": []}: then every exchange's seconds are
        #: appended (for medians, robust to a busy machine)
        self.samples = None
        self._waited = 0.0       # seconds the exchange running now waited for messages
        self._geometry(self.comm.allgather((self.coords, shape)))
        self._axes = self._make_axes()
        self._device_slabs = None

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
        C-contiguous device array (only the slabs sent and received travel through the
        host, or none with a CUDA-aware MPI) of the Halo's shape."""
        self._check(u)
        host = arrays.kind(u) == "host"
        fwd, adj = (self._forward, self._adjoint) if host else \
            (self._device().forward, self._device().adjoint)

        def forward():
            start = time.perf_counter()
            fwd(u)
            self._count("forward", start)

        def adjoint(adj_u):
            if adj_u is None:
                return
            start = time.perf_counter()
            adj(adj_u)
            self._count("adjoint", start)

        steps.run(self.index, "exchange", forward, adjoint, (u,), (u,),
                  "halo_exchange")

    def _count(self, which, start):
        elapsed = time.perf_counter() - start
        t = self.timings[which]
        t[0] += 1
        t[1] += elapsed
        if len(t) > 2:
            t[2] += self._waited
        if self.samples is not None:
            self.samples[which].append((elapsed, self._waited))
        self._waited = 0.0

    def _wait(self, requests):
        start = time.perf_counter()
        _waitall(requests)
        self._waited += time.perf_counter() - start

    def _device(self):
        if self._device_slabs is None:
            from .device_slabs import DeviceSlabs
            self._device_slabs = DeviceSlabs(self)
        return self._device_slabs

    def _check(self, u):
        if not arrays.is_array(u):
            raise DifferentiationError(
                f"halo.exchange takes an array, but got {arrays.describe(u)}.")
        if tuple(u.shape) != self.shape:
            raise DifferentiationError(
                f"halo.exchange got an array of shape {tuple(u.shape)}; this Halo was "
                f"made for local arrays of shape {self.shape} (ghost layers included).")

    def _make_axes(self):
        """Per exchanged axis, computed once: ``(d, lo, hi, wrap, index)``, ``wrap``
        when the axis is periodic and not split (both neighbours are this rank: plain
        copies, no messages), ``index`` the low and high ghost layers and the low and
        high interior slabs sent, as index tuples."""
        axes = []
        me = self.comm.rank
        for d in range(self.ndim):
            w, n = self.width[d], self.shape[d]
            if w == 0:
                continue
            lo, hi = self.neighbors[d]
            if lo == self._null and hi == self._null:
                continue

            def index(start, stop):
                i = [slice(None)] * self.ndim
                i[d] = slice(start, stop)
                return tuple(i)
            axes.append((d, lo, hi, lo == me and hi == me,
                         (index(0, w), index(n - w, n), index(w, 2 * w),
                          index(n - 2 * w, n - w))))
        return tuple(axes)

    def _plan(self, a):
        """Per exchanged axis: ``(d, lo, hi, wrap, views, direct, buffers, fused)``:
        ``views`` the ghost layers and slabs of NumPy array ``a`` (kept for the last few
        arrays: a tape's buffers come back at every step), ``direct`` when all four are
        contiguous (axis 0 of a C-contiguous array: sent from and received into the
        array itself), ``buffers`` the message buffers of ``a``'s dtype (out low, out
        high, in low, in high; reused: one exchange at a time), ``fused`` for a
        C-contiguous array the same as 3-D ``(A, w, B)`` views for the loops of
        :mod:`kadj.mpi.host_slabs`: the array, its ghost layers, the out buffers, its
        slabs, the in buffers."""
        hit = self._views.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        plan = []
        c_order = a.flags.c_contiguous
        for d, lo, hi, wrap, index in self._axes:
            views = tuple(a[i] for i in index)
            direct = all(v.flags.c_contiguous for v in views)
            key = (d, a.dtype.str)
            if key not in self._buffers:
                shape = list(self.shape)
                shape[d] = self.width[d]
                self._buffers[key] = tuple(np.empty(shape, a.dtype) for _ in range(4))
            fused = None     # the 3-D views for the fused loops (C-contiguous arrays)
            if c_order:
                a3 = a.reshape(_three_d(self.shape, d))
                b3 = tuple(b.reshape(_three_d(b.shape, d)) for b in self._buffers[key])
                fused = (a3, tuple(a3[:, i[d], :] for i in index[:2]), b3[:2],
                         tuple(a3[:, i[d], :] for i in index[2:]), b3[2:])
            plan.append((d, lo, hi, wrap, views, direct, self._buffers[key], fused))
        plan = tuple(plan)
        if len(self._views) >= 4:
            self._views.pop(next(iter(self._views)))
        self._views[id(a)] = (a, plan)
        return plan

    def _forward(self, h):
        """Along each axis: my low interior slab goes down (into the low neighbour's
        high ghosts), my high one up; the neighbours' arrive in my ghost layers."""
        comm, null, copyto = self.comm, self._null, np.copyto
        for d, lo, hi, wrap, views, direct, buffers, fused in self._plan(h):
            ghost_lo, ghost_hi, slab_lo, slab_hi = views
            if wrap and fused is not None:
                host_slabs.wrap_forward(fused[0], self.width[d])
                continue
            if wrap:
                copyto(ghost_lo, slab_hi)
                copyto(ghost_hi, slab_lo)
                continue
            out_lo, out_hi, in_lo, in_hi = buffers
            down, up = 4 * d, 4 * d + 1
            requests = []
            if lo != null:
                requests.append(comm.Irecv(ghost_lo if direct else in_lo, lo, up))
                if not direct:
                    copyto(out_lo, slab_lo)
                requests.append(comm.Isend(slab_lo if direct else out_lo, lo, down))
            if hi != null:
                requests.append(comm.Irecv(ghost_hi if direct else in_hi, hi, down))
                if not direct:
                    copyto(out_hi, slab_hi)
                requests.append(comm.Isend(slab_hi if direct else out_hi, hi, up))
            self._wait(requests)
            if not direct:
                if lo != null:
                    copyto(ghost_lo, in_lo)
                if hi != null:
                    copyto(ghost_hi, in_hi)

    def _adjoint(self, g):
        """The transpose, axes in reverse order: each ghost layer's cotangent goes back
        to the rank it came from and is added into the slab it was copied from; the
        ghost layer's cotangent is then zero."""
        comm, null, add, copyto = self.comm, self._null, np.add, np.copyto
        add_zero = host_slabs.add_zero
        for d, lo, hi, wrap, views, direct, buffers, fused in reversed(self._plan(g)):
            ghost_lo, ghost_hi, slab_lo, slab_hi = views
            if wrap and fused is not None:
                host_slabs.wrap_adjoint(fused[0], self.width[d])
                continue
            if wrap:
                add(slab_hi, ghost_lo, out=slab_hi)
                add(slab_lo, ghost_hi, out=slab_lo)
                ghost_lo.fill(0)
                ghost_hi.fill(0)
                continue
            out_lo, out_hi, in_lo, in_hi = buffers
            down, up = 4 * d + 2, 4 * d + 3     # the directions the cotangents travel
            requests = []
            if lo != null:      # my low ghosts came up from lo: send them back down
                requests.append(comm.Irecv(in_lo, lo, up))
                if fused is not None and not direct:
                    host_slabs.pack_zero(fused[1][0], fused[2][0])
                elif not direct:
                    copyto(out_lo, ghost_lo)
                    ghost_lo.fill(0)
                requests.append(comm.Isend(ghost_lo if direct else out_lo, lo, down))
            if hi != null:
                requests.append(comm.Irecv(in_hi, hi, down))
                if fused is not None and not direct:
                    host_slabs.pack_zero(fused[1][1], fused[2][1])
                elif not direct:
                    copyto(out_hi, ghost_hi)
                    ghost_hi.fill(0)
                requests.append(comm.Isend(ghost_hi if direct else out_hi, hi, up))
            self._wait(requests)
            if fused is not None:      # one pass each: add, and zero a ghost sent from
                ghosts, slabs, ins = fused[1], fused[3], fused[4]
                if lo != null:
                    add_zero(slabs[0], ins[0], ghosts[0], direct)
                if hi != null:
                    add_zero(slabs[1], ins[1], ghosts[1], direct)
                continue
            if lo != null:
                if direct:
                    ghost_lo.fill(0)
                add(slab_lo, in_lo, out=slab_lo)
            if hi != null:
                if direct:
                    ghost_hi.fill(0)
                add(slab_hi, in_hi, out=slab_hi)

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


def _waitall(requests, testall=MPI.Request.Testall,
             pause=getattr(os, "sched_yield", lambda: time.sleep(0))):
    """Wait for ``requests``, yielding the core between tests: MPICH's own wait spins,
    which starves the neighbour when ranks share cores (more ranks than cores, or GPU
    runs whose host threads are few); on a core of its own, a yield returns at once."""
    while not testall(requests):
        pause()


def _three_d(shape, d):
    """``shape`` as ``(A, n, B)``: the axes before ``d``, ``d``, the axes after it."""
    return (math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:]))


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
