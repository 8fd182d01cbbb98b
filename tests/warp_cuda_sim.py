"""Warp shuffles in differentiated CUDA kernels, in the simulator (run by
tests/test_cuda_warp.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is
imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/warp_cuda_sim.py warp_sum_while [case ...]

The simulator has no warp shuffles: :mod:`warp_sim_api` adds them with the hardware's
semantics.  Each case checks ``k.adjoint`` against float64 central differences of
forward launches (:func:`kadj.testing.check_grad_cuda`); a case named ``jvp:<kernel>``
checks ``k.jvp`` against central differences along a random direction instead.
Prints ``CASE <name> OK <detail>`` or ``CASE <name> FAIL <why>``.
"""
import math
import os
import sys

import numpy as np
from numba import cuda, float32, float64

import kadj

FULL = 0xFFFFFFFF


@kadj.differentiate
@cuda.jit
def warp_sum_while(x, out):
    """Sum of squares per warp: a shfl_down tree in a while loop, lane 0 writes."""
    i = cuda.grid(1)
    v = x[i] * x[i]
    off = 16
    while off > 0:
        v += cuda.shfl_down_sync(FULL, v, off)
        off //= 2
    if cuda.laneid == 0:
        out[i // 32] = v


@kadj.differentiate
@cuda.jit
def warp_sum_unrolled(x, out, n):
    """The same tree written out, with a guarded load (threads past n add 0)."""
    i = cuda.grid(1)
    v = x[i] if i < n else 0.0
    v = v * v + v
    v += cuda.shfl_down_sync(FULL, v, 16)
    v += cuda.shfl_down_sync(FULL, v, 8)
    v += cuda.shfl_down_sync(FULL, v, 4)
    v += cuda.shfl_down_sync(FULL, v, 2)
    v += cuda.shfl_down_sync(FULL, v, 1)
    if cuda.threadIdx.x % 32 == 0:
        cuda.atomic.add(out, 0, v)


@kadj.differentiate
@cuda.jit
def butterfly_xor(x, out):
    """Butterfly (xor) all-reduce with a mask from activemask(); every lane scales
    its own value by the warp's total."""
    i = cuda.grid(1)
    mask = cuda.activemask()
    v = x[i]
    for k in range(5):
        v += cuda.shfl_xor_sync(mask, v, 16 >> k)
    out[i] = x[i] * v


@kadj.differentiate
@cuda.jit
def scan_up(x, out):
    """Inclusive prefix sum over each warp (Hillis-Steele with shfl_up)."""
    i = cuda.grid(1)
    lane = cuda.laneid
    v = x[i] * x[i]
    d = 1
    for k in range(5):
        t = cuda.shfl_up_sync(FULL, v, d)
        if lane >= d:
            v += t
        d *= 2
    out[i] = v


@kadj.differentiate
@cuda.jit
def broadcast_lane0(x, out):
    """Lane 0's value to every lane (constant source lane: a warp sum in the adjoint)
    and a rotation by a per-lane source lane (the general gather)."""
    i = cuda.grid(1)
    lane = cuda.laneid
    b = cuda.shfl_sync(FULL, x[i], 0)
    r = cuda.shfl_sync(FULL, x[i] * x[i], (lane + 3) % 32)
    out[i] = x[i] * b + r


@kadj.differentiate
@cuda.jit
def ballot_count(x, out):
    """ballot_sync and lanemask_lt are integers: the rank of a positive element among
    its warp's positive elements scales it."""
    i = cuda.grid(1)
    b = cuda.ballot_sync(FULL, x[i] > 0.0)
    below = b & cuda.lanemask_lt()
    rank = 0
    for j in range(32):
        rank += (below >> j) & 1
    out[i] = x[i] * (rank + 1)


@kadj.differentiate
@cuda.jit
def warp_sum_f32(x, out):
    """float32 warp sum of sin(x), shfl_down in a counted loop."""
    i = cuda.grid(1)
    v = float32(x[i] * x[i])
    off = 16
    for k in range(5):
        v += cuda.shfl_down_sync(FULL, v, off)
        off = off // 2
    if cuda.laneid == 0:
        out[i // 32] = v


@kadj.differentiate
@cuda.jit
def two_level_sum(x, out):
    """Block sum in two levels: each warp's shfl_down tree, the warp sums in shared
    memory, then warp 0 alone (``if wid == 0``, the same in every lane of a warp)
    reduces them with shuffles."""
    part = cuda.shared.array(2, float64)
    i = cuda.grid(1)
    lane = cuda.threadIdx.x % 32
    wid = cuda.threadIdx.x // 32
    v = x[i] * x[i] if i < x.shape[0] else 0.0
    off = 16
    while off > 0:
        v += cuda.shfl_down_sync(FULL, v, off)
        off //= 2
    if lane == 0:
        part[wid] = v
    cuda.syncthreads()
    if wid == 0:
        t = part[lane] if lane < 2 else 0.0
        off = 16
        while off > 0:
            t += cuda.shfl_down_sync(FULL, t, off)
            off //= 2
        if lane == 0:
            cuda.atomic.add(out, 0, math.sin(t))


@kadj.differentiate
@cuda.jit
def shuffle_by_block(x, out):
    """A shuffle under a branch on the block index (the same in every lane)."""
    i = cuda.grid(1)
    v = x[i]
    if cuda.blockIdx.x % 2 == 0:
        v = v * cuda.shfl_xor_sync(FULL, v, 1)
    else:
        v = v + cuda.shfl_xor_sync(FULL, v, 2)
    out[i] = v


def _f32(rng, n):
    return rng.standard_normal(n).astype(np.float32)


# name -> (kernel, (griddim, blockdim), make_args(rng))
CASES = {
    "warp_sum_while": (warp_sum_while, (2, 32),
                       lambda r: [r.standard_normal(64), np.zeros(2)]),
    "warp_sum_unrolled": (warp_sum_unrolled, (2, 64),
                          lambda r: [r.standard_normal(128), np.zeros(1), 100]),
    "butterfly_xor": (butterfly_xor, (2, 32),
                      lambda r: [r.standard_normal(64), np.zeros(64)]),
    "scan_up": (scan_up, (1, 64), lambda r: [r.standard_normal(64), np.zeros(64)]),
    "broadcast_lane0": (broadcast_lane0, (1, 64),
                        lambda r: [r.standard_normal(64), np.zeros(64)]),
    "ballot_count": (ballot_count, (1, 32),
                     lambda r: [r.standard_normal(32), np.zeros(32)]),
    "warp_sum_f32": (warp_sum_f32, (1, 64),
                     lambda r: [_f32(r, 64), np.zeros(2, np.float32)]),
    "two_level_sum": (two_level_sum, (2, 64),
                      lambda r: [r.standard_normal(100), np.zeros(1)]),
    "shuffle_by_block": (shuffle_by_block, (3, 32),
                         lambda r: [r.standard_normal(96), np.zeros(96)]),
}


def check_jvp(k, config, args, rng):
    """k.jvp's tangents of the written arrays against central differences along a
    random direction of every differentiable argument (float64)."""
    slots = k.adjoint_plan(*args).adjoint_args
    v = [rng.standard_normal(np.shape(args[i]) or (1,)).astype(np.asarray(args[i]).dtype)
         for i in slots]
    after = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    tangents = [d.copy() for d in v]
    k.jvp[config](*after, *tangents)

    def run(h):
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        for i, d in zip(slots, v):
            a[i] = a[i].astype(np.float64) + h * d
        k.forward(config, *a)
        return a
    f32 = any(np.asarray(a).dtype == np.float32 for a in args)
    h = 1e-2 if f32 else 1e-6
    plus, minus = run(h), run(-h)
    worst = 0.0
    for j, i in enumerate(slots):
        fd = (plus[i] - minus[i]) / (2 * h)
        err = np.max(np.abs(tangents[j] - fd)) / (1.0 + np.max(np.abs(fd)))
        if err > (2e-3 if np.asarray(args[i]).dtype == np.float32 else 1e-6):
            raise AssertionError(f"jvp of {k.arg_names[i]}: {tangents[j]} vs {fd}")
        worst = max(worst, err)
    return worst


def run_case(name):
    from kadj.testing import check_grad_cuda
    rng = np.random.default_rng(0)
    if name.startswith("jvp:"):
        k, config, make = CASES[name[4:]]
        return check_jvp(k, config, make(rng), rng)
    k, config, make = CASES[name]
    res = check_grad_cuda(k, config, make(rng))
    return res.max_rel_error


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    import warp_sim_api
    from cudatools import report_cases
    warp_sim_api.install()
    if os.environ.get("KADJ_TEST_WRONG_WARP_RULE"):
        # a deliberately wrong rule (shfl_down reversed in the wrong direction), to show
        # that the checks above can fail (tests/test_cuda_warp.py)
        from kadj.cuda import warp
        warp._SOURCES["warp_down_adjoint"] = warp._SOURCES["warp_up_adjoint"]
    cases = {n: (lambda n=n: run_case(n)) for n in CASES}
    cases.update({f"jvp:{n}": (lambda n=n: run_case(f"jvp:{n}")) for n in CASES})
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
