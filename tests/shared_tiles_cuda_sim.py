"""CUDA shared-memory tiles whose halo is loaded under a branch, and shared buffers that
carry a block's state through time steps (ping-pong), in the simulator (run by
tests/test_cuda_shared_tiles.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/shared_tiles_cuda_sim.py halo1d [case ...]

CASES are checked against float64 central differences
(:func:`kadj.testing.check_grad_cuda`); kernels with barriers have only the scatter
form (no gather form).  Fresh shared and local
floating-point arrays are filled with NaN (as tests/cuda_gallery_sim.py does), so an
adjoint that reads a slot nobody wrote fails.  REFUSED kernels are refused with a
located :class:`kadj.DifferentiationError` (checked by the test file).  Prints
``CASE <name> OK <detail>`` or ``CASE <name> FAIL <why>``.
"""
import math
import os
import sys

import numpy as np
from numba import cuda, float64

import kadj

TPB = 8          # threads per block of the 1-D kernels
BS = 16          # threads per block side of the 2-D kernels (16 x 16, tile 18 x 18)
TILE = TPB + 2   # a 1-D tile with a one-cell halo on each side
TILE2 = (BS + 2, BS + 2)
PAIR = (2, TILE)  # two rows of a ping-pong buffer
PB = 4           # threads per block side of the 2-D ping-pong kernel
PTILE = (PB + 2, PB + 2)


@kadj.differentiate
@cuda.jit
def halo1d(u, out, c):
    """Second difference from a tile with a one-cell halo, zero outside the domain; the
    halo cells are loaded by the first and the last thread of the block."""
    s = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    bdx = cuda.blockDim.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        s[tx + 1] = u[i]
        if tx == 0:
            if i > 0:
                s[0] = u[i - 1]
            else:
                s[0] = 0.0
        if tx == bdx - 1 or i == n - 1:
            if i < n - 1:
                s[tx + 2] = u[i + 1]
            else:
                s[tx + 2] = 0.0
    cuda.syncthreads()
    if i < n:
        out[i] = c * (s[tx] - 2.0 * s[tx + 1] + s[tx + 2]) + s[tx + 1] * s[tx + 1]


@kadj.differentiate
@cuda.jit
def halo2d(u, out, k):
    """9-point stencil from an (18, 18) tile of a 16 x 16 block: edge halos loaded by
    the threads on the block's edges, corners by the corner threads, zero outside the
    domain."""
    s = cuda.shared.array(TILE2, float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i, j = cuda.grid(2)
    nx, ny = u.shape
    if i < nx and j < ny:
        s[tx + 1, ty + 1] = u[i, j]
        if tx == 0:
            if i > 0:
                s[0, ty + 1] = u[i - 1, j]
            else:
                s[0, ty + 1] = 0.0
        if tx == BS - 1 or i == nx - 1:
            if i < nx - 1:
                s[tx + 2, ty + 1] = u[i + 1, j]
            else:
                s[tx + 2, ty + 1] = 0.0
        if ty == 0:
            if j > 0:
                s[tx + 1, 0] = u[i, j - 1]
            else:
                s[tx + 1, 0] = 0.0
        if ty == BS - 1 or j == ny - 1:
            if j < ny - 1:
                s[tx + 1, ty + 2] = u[i, j + 1]
            else:
                s[tx + 1, ty + 2] = 0.0
        if tx == 0 and ty == 0:
            if i > 0 and j > 0:
                s[0, 0] = u[i - 1, j - 1]
            else:
                s[0, 0] = 0.0
        if (tx == BS - 1 or i == nx - 1) and (ty == BS - 1 or j == ny - 1):
            if i < nx - 1 and j < ny - 1:
                s[tx + 2, ty + 2] = u[i + 1, j + 1]
            else:
                s[tx + 2, ty + 2] = 0.0
        if tx == 0 and (ty == BS - 1 or j == ny - 1):
            if i > 0 and j < ny - 1:
                s[0, ty + 2] = u[i - 1, j + 1]
            else:
                s[0, ty + 2] = 0.0
        if (tx == BS - 1 or i == nx - 1) and ty == 0:
            if i < nx - 1 and j > 0:
                s[tx + 2, 0] = u[i + 1, j - 1]
            else:
                s[tx + 2, 0] = 0.0
    cuda.syncthreads()
    if i < nx and j < ny:
        edge = s[tx, ty + 1] + s[tx + 2, ty + 1] + s[tx + 1, ty] + s[tx + 1, ty + 2]
        corner = s[tx, ty] + s[tx + 2, ty + 2] + s[tx, ty + 2] + s[tx + 2, ty]
        c = s[tx + 1, ty + 1]
        out[i, j] = k * (4.0 * edge + corner - 20.0 * c) + c * c


@kadj.differentiate
@cuda.jit
def pingpong_copy(u, out, alpha, steps):
    """Explicit diffusion inside a block: ``b`` gets the new state from ``a``'s
    neighbours, then is copied back into ``a``, with a barrier after each; zero
    boundary cells at the block's edges."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    if tx == 0:
        a[0] = 0.0
        a[TPB + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        b[tx + 1] = a[tx + 1] + alpha * (a[tx] - 2.0 * a[tx + 1] + a[tx + 2])
        cuda.syncthreads()
        a[tx + 1] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        out[i] = a[tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong_parity(u, out, alpha, steps):
    """One (2, TPB + 2) buffer, step t reading row t % 2 and writing row 1 - t % 2."""
    buf = cuda.shared.array(PAIR, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if tx == 0:
        buf[0, 0] = 0.0
        buf[0, TPB + 1] = 0.0
        buf[1, 0] = 0.0
        buf[1, TPB + 1] = 0.0
    if i < n:
        buf[0, tx + 1] = u[i]
    else:
        buf[0, tx + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        p = t % 2
        v = buf[p, tx + 1]
        buf[1 - p, tx + 1] = v + alpha * (buf[p, tx] - 2.0 * v + buf[p, tx + 2]) * v
        cuda.syncthreads()
    if i < n:
        out[i] = buf[steps % 2, tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong_flag(u, out, alpha, steps):
    """The same with the row held in a variable flipped each step (``p = 1 - p``)."""
    buf = cuda.shared.array(PAIR, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if tx == 0:
        for r in range(2):
            buf[r, 0] = 0.0
            buf[r, TPB + 1] = 0.0
    if i < n:
        buf[0, tx + 1] = u[i]
    else:
        buf[0, tx + 1] = 0.0
    cuda.syncthreads()
    p = 0
    for t in range(steps):
        q = 1 - p
        buf[q, tx + 1] = buf[p, tx + 1] + alpha * (buf[p, tx] - 2.0 * buf[p, tx + 1]
                                                   + buf[p, tx + 2])
        cuda.syncthreads()
        p = q
    if i < n:
        out[i] = buf[p, tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong_swap(u, out, alpha, steps):
    """Two shared arrays whose names are swapped each step (``a, b = b, a``)."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if tx == 0:
        a[0] = 0.0
        a[TPB + 1] = 0.0
        b[0] = 0.0
        b[TPB + 1] = 0.0
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        b[tx + 1] = a[tx + 1] + alpha * (a[tx] - 2.0 * a[tx + 1] + a[tx + 2])
        cuda.syncthreads()
        a, b = b, a
    if i < n:
        out[i] = a[tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong_loss(u, target, loss, alpha, steps):
    """Time steps in shared memory, then each thread adds its squared misfit to one
    global scalar: the diffusivity's adjoint sums over threads and steps."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if tx == 0:
        a[0] = 0.0
        a[TPB + 1] = 0.0
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        b[tx + 1] = a[tx + 1] + alpha * (a[tx] - 2.0 * a[tx + 1] + a[tx + 2])
        cuda.syncthreads()
        a[tx + 1] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        d = a[tx + 1] - target[i]
        cuda.atomic.add(loss, 0, d * d)


@kadj.differentiate
@cuda.jit
def halo_steps_in_place(u, alpha, steps):
    """Time steps on a tile whose halo is loaded from global memory, the result
    written back over ``u``: other blocks read ``u[i]`` as their halo (refused:
    elements other threads may touch; kernels/cuda/stencils.py pingpong_diffusion
    writes into a separate output)."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    if tx == 0:
        if i > 0 and i - 1 < n:
            a[0] = u[i - 1]
        else:
            a[0] = 0.0
    if tx == TPB - 1:
        if i + 1 < n:
            a[TPB + 1] = u[i + 1]
        else:
            a[TPB + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        b[tx + 1] = a[tx + 1] + alpha * (a[tx] - 2.0 * a[tx + 1] + a[tx + 2])
        cuda.syncthreads()
        a[tx + 1] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        u[i] = a[tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong_reflect(u, out, alpha, steps):
    """Ping-pong whose boundary cells thread 0 rewrites at every step (a reflecting
    boundary): refused, the loop stores elements no thread owns."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        if tx == 0:
            a[0] = a[1]
            a[TPB + 1] = a[TPB]
        cuda.syncthreads()
        b[tx + 1] = a[tx + 1] + alpha * (a[tx] - 2.0 * a[tx + 1] + a[tx + 2])
        cuda.syncthreads()
        a[tx + 1] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        out[i] = a[tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong_shifted(u, out, alpha, steps):
    """Each step moves the state one cell left (``a[tx] = b[tx + 1]``): inside the
    loop each thread writes ``a[tx]``, its own element there, although it loaded
    ``a[tx + 1]`` before the loop."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    if tx == 0:
        a[0] = 0.0
        a[TPB + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        b[tx + 1] = a[tx + 1] + alpha * a[tx + 2] * a[tx]
        cuda.syncthreads()
        a[tx] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        out[i] = a[tx + 1]


@kadj.differentiate
@cuda.jit
def pingpong2d(u, out, alpha, steps):
    """2-D ping-pong: the halo cells set to zero by the threads on the block's edges
    before the steps, each step a non-linear 5-point update."""
    a = cuda.shared.array(PTILE, float64)
    b = cuda.shared.array(PTILE, float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i, j = cuda.grid(2)
    nx, ny = u.shape
    if tx == 0:
        a[0, ty + 1] = 0.0
        a[PB + 1, ty + 1] = 0.0
    if ty == 0:
        a[tx + 1, 0] = 0.0
        a[tx + 1, PB + 1] = 0.0
    if i < nx and j < ny:
        a[tx + 1, ty + 1] = u[i, j]
    else:
        a[tx + 1, ty + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        c = a[tx + 1, ty + 1]
        b[tx + 1, ty + 1] = c + alpha * (a[tx, ty + 1] + a[tx + 2, ty + 1] + a[tx + 1, ty]
                                         + a[tx + 1, ty + 2] - 4.0 * c) * c
        cuda.syncthreads()
        a[tx + 1, ty + 1] = b[tx + 1, ty + 1]
        cuda.syncthreads()
    if i < nx and j < ny:
        out[i, j] = a[tx + 1, ty + 1]


@kadj.differentiate
@cuda.jit
def pingpong_reflect_read(u, out, alpha, steps):
    """pingpong_reflect's remedy: the reflecting boundary read in the update (the edge
    threads read their own cell for the missing neighbour), no store at the boundary."""
    a = cuda.shared.array(TILE, float64)
    b = cuda.shared.array(TILE, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        a[tx + 1] = u[i]
    else:
        a[tx + 1] = 0.0
    cuda.syncthreads()
    for t in range(steps):
        c = a[tx + 1]
        left = a[tx] if tx > 0 else c
        right = a[tx + 2] if tx < TPB - 1 else c
        b[tx + 1] = c + alpha * (left - 2.0 * c + right)
        cuda.syncthreads()
        a[tx + 1] = b[tx + 1]
        cuda.syncthreads()
    if i < n:
        out[i] = a[tx + 1]


@kadj.differentiate
@cuda.jit
def block_iteration_all_read(A, v0, out, nit):
    """A fixed-point iteration per block, v = tanh(A v): a loop reads every element of
    ``v``, then the iteration overwrites the thread's own (refused: a thread restores
    only its own element)."""
    v = cuda.shared.array(TPB, float64)
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    v[tid] = v0[b, tid]
    cuda.syncthreads()
    for it in range(nit):
        acc = 0.0
        for j in range(TPB):
            acc += A[b, tid, j] * v[j]
        cuda.syncthreads()
        v[tid] = math.tanh(acc)
        cuda.syncthreads()
    out[b, tid] = v[tid]


@kadj.differentiate
@cuda.jit
def block_iteration_local_copy(A, v0, out, nit):
    """block_iteration_all_read's remedy: the loop reads a per-thread copy of ``v``
    (a cuda.local.array filled at the iteration's start)."""
    v = cuda.shared.array(TPB, float64)
    vl = cuda.local.array(TPB, float64)
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    v[tid] = v0[b, tid]
    cuda.syncthreads()
    for it in range(nit):
        for j in range(TPB):
            vl[j] = v[j]
        cuda.syncthreads()
        acc = 0.0
        for j in range(TPB):
            acc += A[b, tid, j] * vl[j]
        v[tid] = math.tanh(acc)
        cuda.syncthreads()
    out[b, tid] = v[tid]


def _block_iteration_args(r):
    return [0.5 * r.standard_normal((2, TPB, TPB)), r.standard_normal((2, TPB)),
            np.zeros((2, TPB)), 4]


def _vec(r, n):
    return r.uniform(-1.0, 1.0, n)


# name -> (kernel, (griddim, blockdim), make_args(rng))
CASES = {
    "halo1d": (halo1d, (2, TPB), lambda r: [_vec(r, 13), np.zeros(13), 0.7]),
    "halo2d": (halo2d, ((2, 1), (BS, BS)), lambda r: [r.uniform(-1.0, 1.0, (19, 13)),
                                                      np.zeros((19, 13)), 0.3]),
    "pingpong_copy": (pingpong_copy, (2, TPB), lambda r: _pp_args(r, 5)),
    "pingpong_parity": (pingpong_parity, (2, TPB), lambda r: _pp_args(r, 5)),
    "pingpong_flag": (pingpong_flag, (2, TPB), lambda r: _pp_args(r, 5)),
    "pingpong_loss": (pingpong_loss, (2, TPB), lambda r: [_vec(r, 13), _vec(r, 13),
                                                          np.zeros(1), 0.2, 5]),
    "pingpong_shifted": (pingpong_shifted, (2, TPB), lambda r: _pp_args(r)),
    "pingpong2d": (pingpong2d, ((2, 1), (PB, PB)), lambda r: [r.uniform(-1.0, 1.0, (7, 3)),
                                                             np.zeros((7, 3)), 0.2, 3]),
    "pingpong_reflect_read": (pingpong_reflect_read, (2, TPB), lambda r: _pp_args(r)),
    # the names swapped each step: unrolled by two (kadj.buffer_swap), odd and even
    "pingpong_swap": (pingpong_swap, (2, TPB), lambda r: _pp_args(r, 5)),
    "pingpong_swap_even": (pingpong_swap, (2, TPB), lambda r: _pp_args(r, 4)),
    "block_iteration_local_copy": (block_iteration_local_copy, (2, TPB),
                                   _block_iteration_args),
}


def _pp_args(r, steps=4):
    """u, out, alpha, steps of the 1-D ping-pong kernels (13 cells: two blocks)."""
    return [_vec(r, 13), np.zeros(13), 0.2, steps]


# name -> (kernel, make_args(rng)): refused with a located DifferentiationError
REFUSED = {
    "block_iteration_all_read": (block_iteration_all_read, _block_iteration_args),
    "halo_steps_in_place": (halo_steps_in_place, lambda r: [_vec(r, 16), 0.2, 4]),
    "pingpong_reflect": (pingpong_reflect, _pp_args),
}


def run_case(name):
    from kadj.testing import check_grad_cuda
    k, config, make = CASES[name]
    # (one random direction per argument: the simulator runs a thread per Python thread)
    return check_grad_cuda(k, config, make(np.random.default_rng(0)),
                           directions=1).max_rel_error


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    from cuda_gallery_sim import poison_scratch_arrays
    from cudatools import report_cases
    poison_scratch_arrays()
    cases = {n: (lambda n=n: run_case(n)) for n in CASES}
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
