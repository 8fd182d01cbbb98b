"""Small CUDA kernels for the arrays kadj keeps on a device (imported on first use,
by :mod:`kadj.arrays`, :mod:`kadj.fingerprint` and :mod:`kadj.tape_checks`, only for
numba device, CuPy and simulator arrays).  Module-level kernels, so the CUDA simulator
runs them too.

:class:`ChangeFlag` is the device side of a tape's check for unrecorded changes: a
one-word device flag that compare kernels raise on a fingerprint mismatch, poison
kernels that fill gradient buffers with NaN when it is raised, and a copy of it in
mapped host memory, written by a kernel and read by the host only once an event says
the kernel is done.  Nothing here copies to the host or waits for the device, except
:meth:`ChangeFlag.read` with ``wait=True`` and :func:`hash_words`."""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, uint64

__all__ = ["ChangeFlag", "add_flat", "contiguous", "hash_into", "hash_words"]

THREADS = 128                # threads per block of the kernels here (a power of two)
MAX_BLOCKS = 1024            # grid cap of the hash (a grid-stride loop covers the rest)


@cuda.jit
def _add(dst, src):
    i = cuda.grid(1)
    if i < dst.shape[0]:
        dst[i] += src[i]


def add_flat(dst, src, n, stream=None):
    """``dst[:n] += src[:n]`` over 1-D device arrays, on ``stream`` (default stream
    without it)."""
    threads = 128
    blocks = (n + threads - 1) // threads
    config = (blocks, threads) if stream is None else (blocks, threads, stream)
    _add[config](dst, src)


# ---- contiguous copies of strided device arrays ---------------------------------------
@cuda.jit
def _gather1(src, dst):
    i = cuda.grid(1)
    if i < dst.shape[0]:
        dst[i] = src[i]


@cuda.jit
def _gather2(src, dst):
    k = cuda.grid(1)
    n1 = src.shape[1]
    if k < src.shape[0] * n1:
        i, j = k // n1, k % n1
        dst[k] = src[i, j]


@cuda.jit
def _gather3(src, dst):
    k = cuda.grid(1)
    n1, n2 = src.shape[1], src.shape[2]
    if k < src.shape[0] * n1 * n2:
        i, r = k // (n1 * n2), k % (n1 * n2)
        dst[k] = src[i, r // n2, r % n2]


@cuda.jit
def _gather4(src, dst):
    k = cuda.grid(1)
    n1, n2, n3 = src.shape[1], src.shape[2], src.shape[3]
    if k < src.shape[0] * n1 * n2 * n3:
        i, r = k // (n1 * n2 * n3), k % (n1 * n2 * n3)
        j, r = r // (n2 * n3), r % (n2 * n3)
        dst[k] = src[i, j, r // n3, r % n3]


_GATHER = {1: _gather1, 2: _gather2, 3: _gather3, 4: _gather4}


def contiguous(a, stream=None):
    """A fresh C-contiguous 1-D device copy of device array ``a``'s elements in C
    order (a new allocation, so aligned), made on ``stream`` (the default stream
    without it).  Arrays of more than 4 dimensions go through the host."""
    kernel = _GATHER.get(a.ndim)
    if kernel is None:
        return cuda.to_device(np.ascontiguousarray(a.copy_to_host()).reshape(-1))
    out = cuda.device_array(a.size, a.dtype)
    blocks = (a.size + THREADS - 1) // THREADS
    config = (blocks, THREADS) if stream is None else (blocks, THREADS, stream)
    kernel[config](a, out)
    return out


# ---- a position-dependent hash of device memory ---------------------------------------
_K1 = uint64(0x9E3779B97F4A7C15)      # odd: i -> i * K + D is a bijection of the index
_D1 = uint64(0x243F6A8885A308D3)
_K2 = uint64(0xC2B2AE3D27D4EB4F)
_D2 = uint64(0x13198A2E03707344)


@cuda.jit(device=True, inline="always")
def _mix1(x):
    """The splitmix64 finalizer: a bijection of uint64 (xor-shifts and odd products
    are invertible)."""
    x ^= x >> uint64(30)
    x *= uint64(0xBF58476D1CE4E5B9)
    x ^= x >> uint64(27)
    x *= uint64(0x94D049BB133111EB)
    return x ^ (x >> uint64(31))


@cuda.jit(device=True, inline="always")
def _mix2(x):
    """The murmur3 fmix64 finalizer: another bijection of uint64."""
    x ^= x >> uint64(33)
    x *= uint64(0xFF51AFD7ED558CCD)
    x ^= x >> uint64(33)
    x *= uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> uint64(33))


@cuda.jit
def _hash(words, raw, out):
    """out[0] += sum_i mix1(w_i ^ (i*K1 + D1)), out[1] += sum_i mix2(w_i ^ (i*K2 + D2))
    (wrapping uint64 sums) over the words, and the tail bytes of ``raw`` after them
    packed little-endian into one more word at index len(words)."""
    s1 = cuda.shared.array(THREADS, uint64)
    s2 = cuda.shared.array(THREADS, uint64)
    tid = cuda.threadIdx.x
    n = words.shape[0]
    a = uint64(0)
    b = uint64(0)
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        w = words[i]
        k = uint64(i)
        a += _mix1(w ^ (k * _K1 + _D1))
        b += _mix2(w ^ (k * _K2 + _D2))
        i += stride
    if cuda.grid(1) == 0 and raw.shape[0] > n * 8:
        t = uint64(0)
        for j in range(n * 8, raw.shape[0]):
            t |= uint64(raw[j]) << uint64(8 * (j - n * 8))
        k = uint64(n)
        a += _mix1(t ^ (k * _K1 + _D1))
        b += _mix2(t ^ (k * _K2 + _D2))
    s1[tid] = a
    s2[tid] = b
    cuda.syncthreads()
    half = THREADS // 2
    while half > 0:
        if tid < half:
            s1[tid] += s1[tid + half]
            s2[tid] += s2[tid + half]
        cuda.syncthreads()
        half //= 2
    if tid == 0:
        cuda.atomic.add(out, 0, s1[0])
        cuda.atomic.add(out, 1, s2[0])


def hash_into(raw, out, stream):
    """Add the two 64-bit lanes of the hash of 1-D uint8 device array ``raw`` (its
    start 8-byte aligned) into ``out`` (2 uint64 on the device, zeroed by the caller):
    one kernel on ``stream``, nothing copied back."""
    whole = raw.shape[0] - raw.shape[0] % 8
    words = raw[:whole].view(np.uint64)
    blocks = max(1, min(MAX_BLOCKS, (words.shape[0] + THREADS - 1) // THREADS))
    _hash[blocks, THREADS, stream](words, raw, out)


def hash_words(raw):
    """The two 64-bit lanes of the hash of 1-D uint8 device array ``raw`` (its start
    8-byte aligned), as Python ints: one kernel on the default stream, then a 16-byte
    copy to the host (which waits for it)."""
    out = cuda.to_device(np.zeros(2, np.uint64))
    hash_into(raw, out, cuda.default_stream())
    h = out.copy_to_host()
    return int(h[0]), int(h[1])


# ---- the flag of a tape's check for unrecorded changes --------------------------------
TOP = 1 << 62        # a check's code is TOP - its number: the largest code, the first


@cuda.jit
def _compare(kept, now, flag, code):
    """Raise ``flag`` to at least ``code`` when the fingerprints differ."""
    if cuda.grid(1) == 0:
        if kept[0] != now[0] or kept[1] != now[1]:
            cuda.atomic.max(flag, 0, code)


@cuda.jit
def _poison(values, flag):
    """Fill ``values`` with NaN when ``flag`` is raised."""
    if flag[0] != 0:
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < values.shape[0]:
            values[i] = math.nan
            i += stride


@cuda.jit
def _publish(flag, word):
    if cuda.grid(1) == 0:
        word[0] = flag[0]


class ChangeFlag:
    """A tape's device flag of fingerprint mismatches, on the default stream.

    :meth:`compare` enqueues the comparison of two device fingerprints (2 uint64
    each) as check number ``number`` (from 0); :meth:`poison` enqueues the NaN fill of
    a floating-point device buffer, effective when a check failed; :meth:`publish`
    enqueues the copy of the flag to mapped host memory and records an event after
    it; :meth:`read` gives the number of the first failed check (None: none failed, or
    not known yet), read from the mapped word once the event has completed -- or,
    with ``wait=True``, after waiting for it."""

    def __init__(self):
        from . import buffer_pool
        self.stream = cuda.default_stream()
        self.flag = buffer_pool.zeros((1,), np.int64, self.stream)
        self.word = None          # mapped host memory, allocated at the first publish
        self.event = None         # recorded after the latest publish

    def compare(self, kept, now, number):
        _compare[1, 1, self.stream](kept, now, self.flag, np.int64(TOP - number))

    def poison(self, buffer):
        n = buffer.size
        if n == 0:
            return
        flat = buffer.reshape(n)
        if np.dtype(flat.dtype).kind == "c":
            flat = flat.view(np.dtype(flat.dtype).char.lower())
        blocks = max(1, min(MAX_BLOCKS, (flat.shape[0] + THREADS - 1) // THREADS))
        _poison[blocks, THREADS, self.stream](flat, self.flag)

    def publish(self):
        if self.word is None:
            self.word = cuda.mapped_array(1, np.int64)
            _host(self.word)[0] = 0
        _publish[1, 1, self.stream](self.flag, self.word)
        self.event = _event()
        self.event.record(stream=self.stream)

    def read(self, wait=False):
        if self.event is None:
            return None
        if wait:
            self.event.synchronize()
        elif not _complete(self.event):
            return None
        value = int(_host(self.word)[0])
        return None if value == 0 else TOP - value


def _host(word):
    """The host view of a mapped array (the simulator's wraps a NumPy array)."""
    inner = getattr(word, "_ary", None)
    return inner if isinstance(inner, np.ndarray) else word


def _event():
    try:
        return cuda.event(timing=False)
    except TypeError:          # the simulator's events take no arguments
        return cuda.event()


def _complete(event):
    """Has the work before ``event`` completed?  Never waits.  (The simulator runs
    everything synchronously, and its events have no ``query``.)"""
    query = getattr(event, "query", None)
    return True if query is None else bool(query())
