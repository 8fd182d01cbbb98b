"""Cases for tests/test_mpi.py, run under ``mpiexec -n P python tests/mpi_cases.py``.

Each case computes a gradient with the field decomposed over the ranks, gathers it on
rank 0 and compares it with the gradient of the same global problem on one process
(its periodic wrap written here with its own adjoint), itself checked against central
finite differences in float64.  Rank 0 prints ``ok <case>`` per case and ``ALL OK``.
"""
import os
import sys
import time

import numba
import numpy as np
from mpi4py import MPI

import kadj
import kadj.mpi
from kadj.demo.heat_mpi import heat2d, misfit2d as loss2d

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def _abort(kind, value, tb):          # a failing rank must not leave the others hanging
    sys.__excepthook__(kind, value, tb)
    sys.stdout.flush()
    comm.Abort(1)


sys.excepthook = _abort
if os.environ.get("MPI_CASES_DUMP_AFTER"):   # a hang prints every rank's stack, exits
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ["MPI_CASES_DUMP_AFTER"]),
                                      exit=True)


@kadj.differentiate
@numba.njit(cache=True)
def heat1d(u, v, alpha):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + 0.1 * u[i] * u[i]


@kadj.differentiate
@numba.njit(cache=True)
def loss1d(u, target, part):
    s = 0.0
    for i in range(1, u.shape[0] - 1):
        s += 0.5 * (u[i] - target[i]) ** 2
    part[0] = s


KERNELS = {1: (heat1d, loss1d), 2: (heat2d, loss2d)}   # 2-D: the MPI script's


def rest():
    """A barrier that sleeps instead of spinning, while rank 0 computes a reference
    (MPICH's blocking calls busy-wait, taking the cores rank 0 needs)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if SIM:     # the CUDA simulator: device arrays, staged through the host by kadj.mpi
    from numba import cuda

    @kadj.differentiate
    @cuda.jit
    def heat1d_gpu(u, v, alpha):
        i = cuda.grid(1)
        if 0 < i < u.shape[0] - 1:
            v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + 0.1 * u[i] * u[i]

    @kadj.differentiate
    @cuda.jit
    def loss1d_gpu(u, target, part):
        if cuda.grid(1) == 0:
            s = 0.0
            for i in range(1, u.shape[0] - 1):
                s += 0.5 * (u[i] - target[i]) ** 2
            part[0] = s


def split(n, parts):
    """Interior sizes of an uneven split of ``n`` cells over ``parts`` ranks."""
    return [len(c) for c in np.array_split(np.arange(n), parts)]


def local_shape(global_interior, dims, coords):
    return tuple(split(n, p)[c] + 2 for n, p, c in zip(global_interior, dims, coords))


def coords_of(dims):
    """Row-major coordinates of this rank (the order of MPI's Cartesian topology)."""
    return tuple(int(c) for c in np.unravel_index(rank, dims))


def local_of(halo, padded):
    """This rank's local array (ghost layers included) of a global array that has one
    ghost layer per side."""
    return np.ascontiguousarray(
        padded[tuple(slice(s.start, s.stop + 2) for s in halo.global_slices)])


# ---------------------------------------------------------------- one process
def wrap(u, periodic):
    """The global problem's periodic wrap, recorded with its own adjoint."""
    def forward():
        for d, p in enumerate(periodic):
            if p:
                idx = [slice(None)] * u.ndim
                src = list(idx); dst = list(idx)
                n = u.shape[d]
                dst[d], src[d] = 0, n - 2
                u[tuple(dst)] = u[tuple(src)]
                dst[d], src[d] = n - 1, 1
                u[tuple(dst)] = u[tuple(src)]

    def adjoint(g):
        for d in reversed(range(u.ndim)):
            if periodic[d]:
                idx = [slice(None)] * u.ndim
                src = list(idx); dst = list(idx)
                n = u.shape[d]
                dst[d], src[d] = n - 1, 1
                g[tuple(src)] += g[tuple(dst)]
                g[tuple(dst)] = 0
                dst[d], src[d] = 0, n - 2
                g[tuple(src)] += g[tuple(dst)]
                g[tuple(dst)] = 0

    kadj.custom_step(forward, adjoint, reads=(u,), writes=(u,), name="wrap")


def run_problem(u0, target, alpha, steps, exchange, reduce, snapshots=None,
                local=False, online=False):
    """Ping-pong heat steps (exchange, then a launch) and the loss; returns
    (tape, loss, final state).  ``online``: a checkpointed loop of unknown length,
    stopped by ``until`` after ``steps`` steps (the online schedule)."""
    heat, loss_k = KERNELS[u0.ndim]
    u, v = u0.copy(), u0.copy()
    part, loss = np.zeros(1), np.zeros(1)

    def step(i, a, b):
        exchange(a)
        heat(a, b, alpha)
        return b, a

    tape = kadj.mpi.local(kadj.Tape()) if local else kadj.Tape()
    with tape:
        if snapshots is None:
            a, b = u, v
            for i in range(steps):
                a, b = step(i, a, b)
        elif online:
            a, b = kadj.checkpointed_loop(step, (u, v), snapshots=snapshots,
                                          until=lambda i, *state: i == steps - 1)
        else:
            a, b = kadj.checkpointed_loop(step, (u, v), steps=steps,
                                          snapshots=snapshots)
        loss_k(a, target, part)
        reduce(part, loss)
    tape.backward(loss)
    return tape, u, loss


def reference(case, U0, T, alpha):
    """The one-process gradient of the global problem, checked by finite differences."""
    periodic = case["periodic"]
    ex = (lambda a: wrap(a, periodic))

    def cp(p, out):
        out[:] = p

    def red(p, out):
        kadj.custom_step(lambda: cp(p, out), lambda ap, ao: (ap.__iadd__(ao),
                         ao.fill(0)), reads=(p,), writes=(out,), name="copy")

    tape, u, loss = run_problem(U0, T, alpha, case["steps"], ex, red, local=True)
    g = tape.grad(u)
    galpha = tape.scalar_grad("alpha")
    # central differences in float64 along a random interior direction and in alpha
    rng = np.random.default_rng(7)
    d = np.zeros_like(U0)
    d[tuple(slice(1, -1) for _ in U0.shape)] = rng.standard_normal(
        tuple(n - 2 for n in U0.shape))
    h = 1e-5

    def J(u0, al):
        return run_problem(u0, T, al, case["steps"], ex, red, local=True)[2][0]

    fd = (J(U0 + h * d, alpha) - J(U0 - h * d, alpha)) / (2 * h)
    assert abs(fd - np.sum(g * d)) < 1e-6 * max(1.0, abs(fd)), (case["name"], fd,
                                                               np.sum(g * d))
    fda = (J(U0, alpha + h) - J(U0, alpha - h)) / (2 * h)
    assert abs(fda - galpha) < 1e-6 * max(1.0, abs(fda)), (case["name"], fda, galpha)
    return g[tuple(slice(1, -1) for _ in U0.shape)], galpha, loss[0]


# ---------------------------------------------------------------- the cases
def grid(ndim):
    if ndim == 1:
        return (size,)
    return (2, size // 2) if size % 2 == 0 and size > 2 else (size, 1)


CASES = [
    dict(name="pingpong_1d_walls", shape=(13,), periodic=(False,), steps=4),
    dict(name="pingpong_1d_periodic", shape=(13,), periodic=(True,), steps=4),
    dict(name="pingpong_2d_mixed", shape=(9, 8), periodic=(False, True), steps=3),
    dict(name="checkpointed_2d", shape=(9, 8), periodic=(True, False), steps=7,
         snapshots=3),
    dict(name="checkpointed_1d_periodic", shape=(11,), periodic=(True,), steps=6,
         snapshots=2),
    dict(name="online_1d_walls", shape=(12,), periodic=(False,), steps=9,
         snapshots=4, online=True),
]


def gradient_case(case):
    rng = np.random.default_rng(len(case["name"]))
    padded = tuple(n + 2 for n in case["shape"])
    U0 = rng.standard_normal(padded)
    T = rng.standard_normal(padded)
    alpha = 0.15
    dims = grid(len(case["shape"]))
    shape = local_shape(case["shape"], dims, coords_of(dims))
    halo = kadj.mpi.Halo(comm, shape, width=1, dims=dims, periodic=case["periodic"])
    assert halo.coords == coords_of(dims) and halo.global_shape == case["shape"]
    u0, t = local_of(halo, U0), local_of(halo, T)
    reduce = (lambda p, out: kadj.mpi.allreduce_sum(comm, p, out))
    tape, u, loss = run_problem(u0, t, alpha, case["steps"], halo.exchange, reduce,
                                case.get("snapshots"), online=case.get("online", False))
    g = halo.gather(tape.grad(u))
    galpha = kadj.mpi.allreduce_sum(comm, tape.scalar_grad("alpha"))
    if rank == 0:
        ref_g, ref_alpha, ref_loss = reference(case, U0, T, alpha)
        scale = np.abs(ref_g).max()
        err = np.abs(g - ref_g).max() / scale
        assert err < 1e-12, (case["name"], err)
        assert abs(galpha - ref_alpha) < 1e-12 * abs(ref_alpha), (galpha, ref_alpha)
        assert abs(loss[0] - ref_loss) < 1e-12 * abs(ref_loss)
        print(f"ok {case['name']} dims={dims} rel_err={err:.1e}", flush=True)
    rest()


def cuda_sim_case():
    """pingpong_1d_periodic with CUDA kernels on simulator device arrays."""
    if not SIM:
        return
    case = dict(name="cuda_sim_pingpong_1d", shape=(13,), periodic=(True,), steps=3)
    rng = np.random.default_rng(3)
    U0, T = rng.standard_normal(15), rng.standard_normal(15)
    halo = kadj.mpi.Halo(comm, local_shape((13,), (size,), (rank,)), dims=(size,),
                         periodic=(True,))
    u, v = cuda.to_device(local_of(halo, U0)), cuda.to_device(local_of(halo, U0))
    t = cuda.to_device(local_of(halo, T))
    part, loss = cuda.to_device(np.zeros(1)), cuda.to_device(np.zeros(1))
    u0 = u
    with kadj.Tape() as tape:
        a, b = u, v
        for i in range(case["steps"]):
            halo.exchange(a)
            heat1d_gpu[1, 32](a, b, 0.15)
            a, b = b, a
        loss1d_gpu[1, 1](a, t, part)
        kadj.mpi.allreduce_sum(comm, part, loss)
    tape.backward(loss)
    g = halo.gather(tape.grad(u0))
    if rank == 0:
        ref_g = reference(case, U0, T, 0.15)[0]
        err = np.abs(g - ref_g).max() / np.abs(ref_g).max()
        assert err < 1e-12, (case["name"], err)
        print(f"ok {case['name']} rel_err={err:.1e}", flush=True)
    rest()


def transpose_case():
    """<E x, y> = <x, E^T y> summed over ranks, for 3-D exchanges of widths 1 and 2,
    periodic or not, uneven (no kernels: the exchange and its adjoint alone)."""
    rng = np.random.default_rng(100 + rank)
    dims = (size, 1, 1) if size < 4 else (2, 1, 2)
    for width, periodic in [((2, 1, 1), (True, True, False)),
                            ((1, 0, 2), (False, False, True))]:
        coords = coords_of(dims)
        shape = tuple(split(n, p)[c] + 2 * w for n, p, c, w in
                      zip((11, 4, 9), dims, coords, width))
        halo = kadj.mpi.Halo(comm, shape, width=width, dims=dims, periodic=periodic)
        x, y = rng.standard_normal(shape), rng.standard_normal(shape)
        ex = x.copy()
        halo.exchange(ex)
        with kadj.Tape() as tape:
            z = x.copy()
            halo.exchange(z)
        tape.backward(seeds=[(z, y)])
        assert np.array_equal(z, ex)
        lhs = comm.allreduce(float(np.sum(ex * y)))
        rhs = comm.allreduce(float(np.sum(x * tape.grad(z))))
        assert abs(lhs - rhs) < 1e-12 * max(1.0, abs(lhs)), (lhs, rhs)
        # a Fortran-ordered array (strided slabs on every axis, no fused loops): the
        # same exchange and adjoint
        f = np.asfortranarray(x)
        with kadj.Tape() as tape_f:
            halo.exchange(f)
        tape_f.backward(seeds=[(f, np.asfortranarray(y))])
        assert np.array_equal(f, ex)
        assert np.array_equal(tape_f.grad(f), tape.grad(z))
    if rank == 0:
        print("ok transpose_3d", flush=True)


def cuda_sim_slabs_case():
    """Device exchanges (only the slabs staged through the host, or handed to MPI
    directly with KADJ_MPI_CUDA_AWARE=1) of 2-D simulator arrays, split along axis 0
    (strided slabs along axis 1), with an unsplit periodic axis: the forward equals the
    NumPy exchange of the same data, the adjoint is its transpose over the ranks."""
    if not SIM:
        return
    from kadj.mpi import device_slabs
    rng = np.random.default_rng(200 + rank)
    for width, periodic in [((1, 1), (True, True)), ((2, 1), (False, True))]:
        shape = (split(9 + size, size)[rank] + 2 * width[0], 5 + 2 * width[1])
        halo = kadj.mpi.Halo(comm, shape, width=width, dims=(size, 1),
                             periodic=periodic)
        x, y = rng.standard_normal(shape), rng.standard_normal(shape)
        ex = x.copy()
        halo.exchange(ex)                        # the NumPy exchange
        for aware in ("0", "1"):
            os.environ["KADJ_MPI_CUDA_AWARE"] = aware
            assert device_slabs.cuda_aware() == (aware == "1")
            z = cuda.to_device(x)
            with kadj.Tape() as tape:
                halo.exchange(z)
            seed = cuda.to_device(y)
            tape.backward(seeds=[(z, seed)])
            assert np.array_equal(z.copy_to_host(), ex), (width, aware)
            gz = tape.grad(z)
            gz = gz.copy_to_host() if hasattr(gz, "copy_to_host") else np.asarray(gz)
            lhs = comm.allreduce(float(np.sum(ex * y)))
            rhs = comm.allreduce(float(np.sum(x * gz)))
            assert abs(lhs - rhs) < 1e-12 * max(1.0, abs(lhs)), (width, aware, lhs, rhs)
        del os.environ["KADJ_MPI_CUDA_AWARE"]
    try:                # device arrays must be C-contiguous (3-D views per axis)
        halo.exchange(cuda.to_device(np.asfortranarray(x)))
    except kadj.DifferentiationError as e:
        assert "not C-contiguous" in str(e), str(e)
    else:
        raise AssertionError("a Fortran-ordered device array was exchanged")
    if rank == 0:
        print("ok cuda_sim_slabs", flush=True)


def reductions_case():
    """max/min/sum allreduce of arrays with ties, gradients against the analytic ones."""
    x = np.array([float(rank % 2), float(-rank), 2.0, float(rank)])
    w = np.array([1.0, 2.0, 3.0, 4.0])
    for op in ("max", "min", "sum"):
        with kadj.Tape() as tape:
            out = getattr(kadj.mpi, f"allreduce_{op}")(comm, x)
        tape.backward(seeds=[(out, w)])
        everyone = np.array(comm.allgather(x))
        expect = getattr(np, op)(everyone, axis=0)
        assert np.array_equal(out, expect), (op, out, expect)
        if op == "sum":
            ref = w
        else:     # to the lowest rank holding the extremum
            winner = np.argmax(everyone == expect, axis=0)
            ref = np.where(winner == rank, w, 0.0)
        assert np.array_equal(tape.grad(x), ref), (op, rank, tape.grad(x), ref)
    if rank == 0:
        print("ok reductions", flush=True)


def config_case():
    """Decompositions that cannot work are refused on every rank, with the reason."""
    def refused(text, *args, **kwargs):
        try:
            kadj.mpi.Halo(comm, *args, **kwargs)
        except ValueError as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError(f"Halo{args} was accepted")
    refused("whose product is not the number of ranks", (8,), dims=(size + 1,))
    refused("fewer than the ghost width", (4 + rank,), width=2, dims=(size,))
    if size >= 4:     # ranks (0, 0) and (0, 1) disagree on the size along axis 0
        refused("different interior sizes", (5 + (rank == 1), 5), dims=(2, size // 2))
    halo = kadj.mpi.Halo(comm, (5 + rank, 4), dims=(size, 1))
    try:
        halo.exchange(np.zeros((4, 4)))
    except kadj.DifferentiationError as e:
        assert "shape" in str(e)
    else:
        raise AssertionError("an array of the wrong shape was exchanged")
    if rank == 0:
        print("ok config", flush=True)


def mismatch_case():
    """Rank 1 runs an exchange outside its tape that rank 0 records: every rank must
    raise at backward (the backward would otherwise hang)."""
    if size < 2:
        return
    halo = kadj.mpi.Halo(comm, (6,), width=1, dims=(size,), periodic=(True,))
    u, v, part = np.ones(6), np.zeros(6), np.zeros(1)
    if rank == 1:
        halo.exchange(u)
    with kadj.Tape() as tape:
        if rank != 1:
            halo.exchange(u)
        heat1d(u, v, 0.1)
        loss1d(v, v * 0, part)
    try:
        tape.backward(part)
    except kadj.DifferentiationError as e:
        assert "different communicating steps" in str(e), str(e)
        ok = 1
    else:
        ok = 0
    if comm.allreduce(ok) != size:
        raise AssertionError("a rank did not raise on the mismatch")
    # a boundary condition set from Python on rank 0 only, unrecorded: rank 0's tape
    # sees the change, and every rank must stop instead of hanging in the adjoints
    u[:] = 1.0
    with kadj.Tape() as tape:
        halo.exchange(u)
        heat1d(u, v, 0.1)
        if rank == 0:
            v[1] = 0.0
        loss1d(v, v * 0, part)
        kadj.mpi.allreduce_sum(comm, part, part)
    try:
        tape.backward(part)
    except kadj.DifferentiationError as e:
        assert ("changed outside the recorded launches" in str(e) if rank != 0 else
                "was changed outside" in str(e)), str(e)
        ok = 1
    else:
        ok = 0
    if comm.allreduce(ok) != size:
        raise AssertionError("a rank did not raise on the unrecorded change")
    if rank == 0:
        print("ok mismatch", flush=True)


if __name__ == "__main__":
    start = time.perf_counter()
    only = sys.argv[1:]
    for case in CASES:
        if not only or case["name"] in only:
            gradient_case(case)
    for fn in (cuda_sim_case, cuda_sim_slabs_case, transpose_case, reductions_case,
               config_case, mismatch_case):
        if not only or fn.__name__ in only:
            fn()
    if rank == 0:
        print(f"ALL OK on {size} ranks in {time.perf_counter() - start:.1f} s",
              flush=True)
