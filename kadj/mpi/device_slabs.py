"""Halo exchanges of device arrays (numba device arrays, CuPy arrays, the CUDA
simulator's arrays): only the slabs travel.

Along axis ``d`` a C-contiguous local array of shape ``(..., n, ...)`` is seen as a 3-D
array ``(A, n, B)``, so that every ghost layer and interior slab is a 3-D view.  Small
kernels pack a slab sent into a contiguous device buffer (one per neighbour, made once
per axis and dtype) and unpack a received one into the ghost layers; the adjoint
packs the ghost layers' cotangents and zeroes them in one kernel, and adds the
received ones into the interior slabs in another.  Between the device buffers and MPI:

* a CUDA-aware MPI (:func:`cuda_aware`) is given the device buffers themselves;
* otherwise each buffer is copied to a host buffer (allocated once) and back: per
  exchange only the slabs sent and received cross the bus, never the whole array.
"""
from __future__ import annotations

import ctypes
import math
import os

import numpy as np
from mpi4py import MPI
from numba import cuda

from .. import arrays
from ..device_ops import _gather3
from ..errors import DifferentiationError

__all__ = ["DeviceSlabs", "cuda_aware"]

THREADS = 128


@cuda.jit
def _pack_zero(src, out):
    """out[k] = src[i, j, l], then src[i, j, l] = 0 (the adjoint's send)."""
    k = cuda.grid(1)
    n1, n2 = src.shape[1], src.shape[2]
    if k < src.shape[0] * n1 * n2:
        i, r = k // (n1 * n2), k % (n1 * n2)
        out[k] = src[i, r // n2, r % n2]
        src[i, r // n2, r % n2] = 0


@cuda.jit
def _unpack(inp, dst):
    """dst[i, j, l] = inp[k]."""
    k = cuda.grid(1)
    n1, n2 = dst.shape[1], dst.shape[2]
    if k < dst.shape[0] * n1 * n2:
        i, r = k // (n1 * n2), k % (n1 * n2)
        dst[i, r // n2, r % n2] = inp[k]


@cuda.jit
def _accumulate(inp, dst):
    """dst[i, j, l] += inp[k] (the adjoint's receive)."""
    k = cuda.grid(1)
    n1, n2 = dst.shape[1], dst.shape[2]
    if k < dst.shape[0] * n1 * n2:
        i, r = k // (n1 * n2), k % (n1 * n2)
        dst[i, r // n2, r % n2] += inp[k]


def _launch(kernel, a, b, size):
    threads = min(THREADS, size)       # thin slabs: no idle threads
    kernel[(size + threads - 1) // threads, threads](a, b)


_aware = None


def cuda_aware():
    """Whether the MPI library takes device buffers: ``KADJ_MPI_CUDA_AWARE=1`` or
    ``=0`` decides; otherwise MPICH's (and Open MPI's) ``MPIX_Query_cuda_support()``
    answers, looked up in the MPI library loaded by mpi4py; False when it cannot be
    asked.  Asked once per process."""
    global _aware
    env = os.environ.get("KADJ_MPI_CUDA_AWARE", "").strip()
    if env in ("0", "1"):
        return env == "1"
    if _aware is None:
        _aware = _query()
    return _aware


def _query():
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "libmpi" in line}
        for path in sorted(libs):
            fn = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return bool(fn())
    except (OSError, ValueError):
        pass
    return False


def _mpi_buffer(a):
    """What MPI is given for device buffer ``a``: the simulator's host array for a
    simulator array (its memory is host memory), else ``a`` itself (mpi4py reads
    ``__cuda_array_interface__``)."""
    return a._ary if arrays.kind(a) == "simulator" else a


class DeviceSlabs:
    """The device side of a :class:`kadj.mpi.halo.Halo`: its forward and adjoint
    exchanges of device arrays."""

    def __init__(self, halo):
        self.halo = halo
        self._buffers = {}       # (axis, dtype) -> (device buffers, host buffers)
        self._views = {}         # id(array) -> (array, its axes), the last four

    def _axes(self, a):
        """Per exchanged axis: ``(d, lo, hi, wrap, views, device, host)``, ``views``
        the 3-D ghost layers and slabs of ``a`` (low ghost, high ghost, low slab,
        high slab; kept for the last four arrays), ``device``/``host`` four buffers
        (out low, out high, in low, in high)."""
        hit = self._views.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        h = self.halo
        k = arrays.kind(a)
        layout = arrays._layout(a, k)
        key_array, a = a, arrays._numba(a)
        dtype = np.dtype(layout[3])
        if not _c_contiguous(layout):
            raise DifferentiationError(
                f"halo.exchange got a device array that is not C-contiguous "
                f"({arrays.describe(a)}, strides {layout[2]}); exchange a C-contiguous "
                "array (cuda.device_array / cuda.to_device make them).")
        out = []
        for d, lo, hi, wrap, index in h._axes:
            n, w = h.shape[d], h.width[d]
            a3 = a.reshape(math.prod(h.shape[:d]), n, math.prod(h.shape[d + 1:]))
            views = tuple(a3[:, i[d], :] for i in index)
            key = (d, dtype.str)
            if key not in self._buffers:
                size = a3.shape[0] * w * a3.shape[2]
                dev = tuple(cuda.device_array(size, dtype) for _ in range(4))
                host = tuple(_host_buffer(size, dtype) for _ in range(4))
                self._buffers[key] = (dev, host)
            out.append((d, lo, hi, wrap, views) + self._buffers[key])
        if len(self._views) >= 4:
            self._views.pop(next(iter(self._views)))
        self._views[id(key_array)] = (key_array, out)
        return out

    def forward(self, u):
        self._run(u, adjoint=False)

    def adjoint(self, g):
        self._run(g, adjoint=True)

    def _run(self, a, adjoint):
        null = MPI.PROC_NULL
        axes = self._axes(a)
        send_kernel = _pack_zero if adjoint else _gather3   # out[k] = src[i, j, l], C order
        recv_kernel = _accumulate if adjoint else _unpack
        for d, lo, hi, wrap, views, dev, host in (reversed(axes) if adjoint else axes):
            ghost_lo, ghost_hi, slab_lo, slab_hi = views
            size = dev[0].shape[0]
            # what leaves towards lo and hi: the slabs (forward), the ghost layers'
            # cotangents (adjoint); what arrives goes into the ghost layers (forward),
            # is added into the slabs (adjoint)
            send_lo, send_hi = (ghost_lo, ghost_hi) if adjoint else (slab_lo, slab_hi)
            recv_lo, recv_hi = (slab_lo, slab_hi) if adjoint else (ghost_lo, ghost_hi)
            if wrap:       # both neighbours are this rank: low goes to high and back
                _launch(send_kernel, send_lo, dev[0], size)
                _launch(send_kernel, send_hi, dev[1], size)
                _launch(recv_kernel, dev[0], recv_hi, size)
                _launch(recv_kernel, dev[1], recv_lo, size)
                continue
            sides = [(lo, send_lo, recv_lo, 0, 2), (hi, send_hi, recv_hi, 1, 3)]
            sides = [s for s in sides if s[0] != null]
            for _, send, _, o, _ in sides:
                _launch(send_kernel, send, dev[o], size)
            self._transfer(d, adjoint, sides, dev, host)
            for _, _, recv, _, i in sides:
                _launch(recv_kernel, dev[i], recv, size)

    def _transfer(self, d, adjoint, sides, dev, host):
        """Send ``dev[o]`` to each side's neighbour, receive ``dev[i]`` from it."""
        comm = self.halo.comm
        down, up = (4 * d + 2, 4 * d + 3) if adjoint else (4 * d, 4 * d + 1)
        aware = cuda_aware()
        if aware:
            cuda.synchronize()               # the packing kernels are done
            bufs = [_mpi_buffer(b) for b in dev]
        else:
            for _, _, _, o, _ in sides:
                dev[o].copy_to_host(host[o])
            bufs = host
        requests = []
        for rank, _, _, o, i in sides:      # o == 0: the low side
            recv_tag, send_tag = (up, down) if o == 0 else (down, up)
            requests.append(comm.Irecv(bufs[i], rank, recv_tag))
            requests.append(comm.Isend(bufs[o], rank, send_tag))
        self.halo._wait(requests)
        if not aware:
            for _, _, _, _, i in sides:
                dev[i].copy_to_device(host[i])


def _host_buffer(size, dtype):
    try:
        return cuda.pinned_array(size, dtype)
    except Exception:            # pragma: no cover - no pinned memory available
        return np.empty(size, dtype)


def _c_contiguous(layout):
    _, shape, strides, dtype = layout
    step = np.dtype(dtype).itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != step:
            return False
        step *= n
    return True
