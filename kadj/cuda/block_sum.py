"""The block sum of the adjoints every thread adds to (scalar arguments, uniform
elements): ``block_add_f64(out, idx, v)`` adds the sum of ``v`` over the thread block
to ``out[idx]`` with one global atomic; ``block_add_f32`` likewise for float32.

Every thread of the block must call it (the adjoint calls it at its end, where all
threads arrive: :func:`kadj.cuda.lower.block_sum`).  On a GPU each warp sums its lanes
with shuffles (``shfl_down_sync``, masked to the lanes that exist when the block's last
warp is partial), lane 0 of each warp puts the warp's sum in shared memory, and warp 0
sums those and adds the total with one atomic.  Measured on an H200 (README), this is
what a careful hand-written adjoint does, and it is 13-16% faster on the heat stencils
than 32 shared-memory slots filled by atomics and summed by one thread.  The CUDA
simulator has no shuffles: there the threads write their values to shared memory and
thread 0 sums them, with the same contract.  A barrier first lets a second sum in the
same kernel reuse the shared slots safely.

Slots.  One atomic per block on one address is serialised by the memory system: with
hundreds of thousands of blocks it costs a stencil adjoint about a fifth of its time
(README, "Measured on a GPU").  The gather form, which launches a second kernel anyway,
spreads them: ``block_slot_f64(slots, row, v)`` adds the block's sum to one of the
:data:`SLOTS` float64 slots of row ``row`` of the flat array ``slots`` (the slot from
the block's index, ``x + 37 y + 101 z`` modulo :data:`SLOTS`; slots :data:`STRIDE`
elements apart, so they fall in different cache lines), and
``slot_total_f64(slots, row, out, idx)``, called by every thread of the second kernel,
lets thread 0 of block 0 sum the slots into ``out[idx]`` (one atomic) and set them to
zero again
(:mod:`kadj.cuda.slots` keeps one zeroed slots array per device, stream and host
thread).  The ``_f32`` versions sum float32 values; their slots are float64 too.
"""
from __future__ import annotations

import functools

from numba import float32, float64

# Plain functions over the module's global ``cuda`` (bound to numba.cuda by helpers():
# the simulator swaps that global for its per-thread module); helpers() compiles them
# as device functions.
cuda = None

_NAMES = {"block_add_f64": float64, "block_add_f32": float32}
_SLOT_NAMES = {"block_slot_f64": float64, "block_slot_f32": float32}
_TOTAL_NAMES = {"slot_total_f64": float64, "slot_total_f32": float32}
SLOTS = 128      # slots per row
STRIDE = 16      # float64 elements between slots: 128 bytes


def _warp_total(v, lane, lanes):
    """The sum of ``v`` over the first ``lanes`` lanes of the warp (1..32), in lane 0."""
    mask = 0xFFFFFFFF if lanes == 32 else (1 << lanes) - 1
    off = 16
    while off > 0:
        r = cuda.shfl_down_sync(mask, v, off)
        if lane + off < lanes:
            v += r
        off >>= 1
    return v


def _gpu_sum(dt, warp_total, finish):
    def block_sum(out, idx, v):
        """``finish(out, idx, total)`` in thread 0 with the total of ``v`` over the
        block."""
        warps = cuda.shared.array(32, dt)
        t = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
        lane = t & 31
        w = t >> 5
        cuda.syncthreads()
        s = warp_total(dt(v), lane, min(32, nt - (t - lane)))
        if lane == 0:
            warps[w] = s
        cuda.syncthreads()
        if w == 0:
            s = dt(0)
            if lane < (nt + 31) >> 5:
                s = warps[lane]
            s = warp_total(s, lane, min(32, nt))
            if lane == 0:
                finish(out, idx, s)
    return block_sum


def _simulator_sum(dt, finish):
    def block_sum(out, idx, v):
        buf = cuda.shared.array(1024, dt)
        t = cuda.threadIdx.x + cuda.blockDim.x * (
            cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
        nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
        cuda.syncthreads()
        buf[t] = v
        cuda.syncthreads()
        if t == 0:
            s = buf[0]
            for k in range(1, nt):
                s += buf[k]
            finish(out, idx, s)
    return block_sum


def _add(out, idx, s):
    cuda.atomic.add(out, idx, s)


def _add_to_slot(slots, row, s):
    # (any spread of the blocks over the slots will do: 32-bit arithmetic)
    b = (cuda.blockIdx.x + 37 * cuda.blockIdx.y + 101 * cuda.blockIdx.z) & (SLOTS - 1)
    cuda.atomic.add(slots, row * (SLOTS * STRIDE) + b * STRIDE, float64(s))


def _adding_as(dt):
    def add_as(out, idx, s):
        cuda.atomic.add(out, idx, dt(s))
    return add_as


def _slot_total(sum_into):
    # thread 0 of block 0 alone sums the row's slots: no shared memory and no barrier
    # (two calls of a device function that holds a shared array inside another one
    # did not link: each brought its own copy of the array's symbol)
    def slot_total(slots, row, out, idx):
        if cuda.blockIdx.x == 0 and cuda.blockIdx.y == 0 and cuda.blockIdx.z == 0 and \
                cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0 and cuda.threadIdx.z == 0:
            v = float64(0)
            for k in range(SLOTS):
                v += slots[row * (SLOTS * STRIDE) + k * STRIDE]
                slots[row * (SLOTS * STRIDE) + k * STRIDE] = float64(0)
            sum_into(out, idx, v)
    return slot_total


@functools.lru_cache(maxsize=None)
def helpers():
    """{name: device function} (compiled on first use)."""
    global cuda
    from numba import config
    from numba import cuda as numba_cuda

    cuda = numba_cuda   # (the simulator swaps this global for its per-thread module)
    device = numba_cuda.jit(device=True)
    sim = getattr(config, "ENABLE_CUDASIM", False)
    warp_total = None if sim else device(_warp_total)

    def summing(dt, finish):
        return device(_simulator_sum(dt, finish) if sim else
                      _gpu_sum(dt, warp_total, finish))

    # (the finishing atomics are inlined into the sums: compiled with them, on the
    # compute capability the caller compiles for)
    inline = numba_cuda.jit(device=True, inline="always")
    add, to_slot = inline(_add), inline(_add_to_slot)
    out = {}
    for name, slot, tot in zip(_NAMES, _SLOT_NAMES, _TOTAL_NAMES):
        dt = _NAMES[name]
        out[name] = summing(dt, add)
        out[slot] = summing(dt, to_slot)
        out[tot] = device(_slot_total(inline(_adding_as(dt))))
    for name, fn in out.items():
        fn.__name__ = fn.__qualname__ = name
        fn.__module__ = __name__
        globals()[name] = fn
    return out


def for_dtype(dtype):
    """The block-sum device function for a numba float type, or None."""
    name = next((n for n, dt in _NAMES.items() if dt == dtype), None)
    return None if name is None else helpers()[name]


def slot_functions(dtype):
    """(block_slot, slot_total) device functions for a numba float type, or None."""
    name = next((n for n, dt in _NAMES.items() if dt == dtype), None)
    if name is None:
        return None
    suffix = name.rsplit("_", 1)[1]
    fns = helpers()
    return fns[f"block_slot_{suffix}"], fns[f"slot_total_{suffix}"]


def __getattr__(name):
    if name in _NAMES or name in _SLOT_NAMES or name in _TOTAL_NAMES:
        return helpers()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
