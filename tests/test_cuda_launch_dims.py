"""Launches and stores whose threads would share an adjoint element.

- A launch extending along a dimension whose thread/block index the kernel never reads
  (a ``cuda.grid(1)`` kernel launched ``[(2,), (8, 2)]`` or ``[(2, 2), (8,)]``)
  duplicates threads: the adjoint launch is refused, in the gather and the scatter
  form, and a forward launch recorded on a Tape is refused when recorded.
- A plain store of a differentiated value that many threads make (``sm[0] = ...`` by
  every thread of a block, ``y[0] = ...`` by every thread) is refused on both typing
  paths; guarded by ``if cuda.threadIdx.x == 0:`` it is accepted.
- A non-contiguous NumPy view passed to a CUDA launch is refused with the argument's
  name before anything is transferred.

The gradients and launches run in the CUDA simulator: this file runs itself as a
script in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``; the refusals of the stores are
also checked in this process, through numba-cuda's typing.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda, float64

import kadj

HERE = os.path.dirname(os.path.abspath(__file__))
STORE_MSG = "the same element of the"


@kadj.differentiate
@cuda.jit
def heat(u, v, c):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        v[i] = u[i] + c * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def sum_by_row(x, out):
    # reads threadIdx.y besides cuda.grid(1): threads (i, 0) and (i, 1) both load x[i],
    # so adj_x[i] may not be accumulated with a plain +=
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(out, cuda.threadIdx.y, x[i] * x[i])


@kadj.differentiate
@cuda.jit
def no_thread_index(a, out):
    out[0] = a * a


@kadj.differentiate
@cuda.jit
def bcast_shared(x, y):
    sm = cuda.shared.array(1, float64)
    i = cuda.grid(1)
    sm[0] = x[cuda.blockIdx.x]        # every thread of the block stores it
    cuda.syncthreads()
    y[i] = sm[0] * x[i]


@kadj.differentiate
@cuda.jit
def bcast_guarded(x, y):
    sm = cuda.shared.array(1, float64)
    i = cuda.grid(1)
    if cuda.threadIdx.x == 0:
        sm[0] = x[cuda.blockIdx.x]
    cuda.syncthreads()
    y[i] = sm[0] * x[i]


@kadj.differentiate
@cuda.jit
def store_all(x, y, a):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[0] = a * 2.0                # every thread stores it
        y[i + 1] = x[i] * a


@kadj.differentiate
@cuda.jit
def store_first(x, y, a):
    i = cuda.grid(1)
    if i < x.shape[0]:
        if i == 0:
            y[0] = a * 2.0
        y[i + 1] = x[i] * a


@kadj.differentiate
@cuda.jit
def block_max_unguarded(x, out):
    sm = cuda.shared.array(8, float64)
    tid = cuda.threadIdx.x
    sm[tid] = x[cuda.grid(1)]
    cuda.syncthreads()
    out[cuda.blockIdx.x] = sm[0] * sm[7]   # every thread of a block stores it


@kadj.differentiate
@cuda.jit
def block_early_return(x, out):
    sm = cuda.shared.array(8, float64)
    tid = cuda.threadIdx.x
    sm[tid] = x[cuda.grid(1)]
    cuda.syncthreads()
    if tid != 0:
        return
    out[cuda.blockIdx.x] = sm[0] * sm[7]


def _args(r):
    return {"heat": [r.random(16), np.zeros(16), 0.25],
            "sum_by_row": [r.random(13), np.zeros(2)],
            "no_thread_index": [0.7, np.zeros(1)],
            "bcast_shared": [r.random(16), np.zeros(16)],
            "bcast_guarded": [r.random(16), np.zeros(16)],
            "store_all": [r.random(13), np.zeros(14), 0.7],
            "store_first": [r.random(13), np.zeros(14), 0.7],
            "block_max_unguarded": [r.random(16), np.zeros(2)],
            "block_early_return": [r.random(16), np.zeros(2)]}


# kernel -> phrase of its refusal
REFUSED = {"bcast_shared": "every thread of a block stores the same element of the "
                           "shared array 'sm'",
           "store_all": "every thread stores the same element of the global array 'y'",
           "block_max_unguarded": "threads that differ only in threadIdx.x store the "
                                  "same element of the global array 'out'"}
ACCEPTED = ["bcast_guarded", "store_first", "block_early_return"]


# ---------------------------------------------------------------------- in this process
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_store_by_many_threads_is_refused(name):
    k = globals()[name]
    with pytest.raises(kadj.DifferentiationError) as info:
        k.compiled(*_args(np.random.default_rng(0))[name])
    msg = str(info.value)
    assert REFUSED[name] in msg, msg
    assert "test_cuda_launch_dims.py:" in msg and "if cuda.threadIdx.x == 0:" in msg, msg


@pytest.mark.parametrize("name", ACCEPTED)
def test_store_by_one_thread_is_accepted(name):
    k = globals()[name]
    assert "def " in k.adjoint_source(*_args(np.random.default_rng(0))[name])


def test_launch_check_needs_no_gpu():
    args = _args(np.random.default_rng(0))["heat"]
    comp = heat.compiled(*args)
    assert heat.adjoint_report(*args)["thread_dims"] == {"block": "x", "grid": "x"}
    heat.check_adjoint_launch("heat.adjoint", ((2,), (8,)), comp)
    with pytest.raises(kadj.DifferentiationError, match=r"2 blocks along z"):
        heat.check_adjoint_launch("heat.adjoint", ((2, 1, 2), (8,)), comp)


# ---------------------------------------------------------------------- in the simulator
def _heat_reference(u, c, ct):
    n = u.shape[0]
    ref = np.zeros(n)
    for i in range(1, n - 1):
        ref[i - 1] += c * ct[i]
        ref[i] += (1 - 2 * c) * ct[i]
        ref[i + 1] += c * ct[i]
    ref_c = sum(ct[i] * (u[i - 1] - 2 * u[i] + u[i + 1]) for i in range(1, n - 1))
    return ref, ref_c


def _refused(fn, *phrases):
    try:
        fn()
    except kadj.DifferentiationError as exc:
        msg = str(exc)
        assert all(p in msg for p in phrases), msg
        return
    raise AssertionError(f"not refused: {phrases}")


def case_extra_launch_dims():
    """Both forms: the right launch matches the analytic VJP, the two launches with an
    extra dimension are refused and write nothing."""
    rng = np.random.default_rng(1)
    u, c, ct = rng.random(16), 0.25, rng.standard_normal(16)
    ref, ref_c = _heat_reference(u, c, ct)
    scatter = kadj.differentiate(heat.dispatcher, gather=False)
    worst = 0.0
    for k in (heat, scatter):
        bufs = [np.zeros(16), ct.copy(), np.zeros(1)]
        k.adjoint[(2,), (8,)](u, np.zeros(16), c, *bufs)
        worst = max(worst, np.max(np.abs(bufs[0] - ref)), abs(bufs[2][0] - ref_c))
        for cfg, phrase in ((((2,), (8, 2))), "2 threads per block along y"), \
                           ((((2, 2), (8,))), "2 blocks along y"):
            bufs = [np.zeros(16), ct.copy(), np.zeros(1)]
            _refused(lambda: k.adjoint[cfg](u, np.zeros(16), c, *bufs), phrase,
                     f"heat.adjoint[{cfg[0]!r}, {cfg[1]!r}]", "[(n,), (256,)]")
            assert not bufs[0].any() and np.array_equal(bufs[1], ct), "buffers written"
    assert heat.adjoint_report(u, np.zeros(16), c)["gather"]["used"]
    assert worst < 1e-12, worst
    return worst


def case_tape_refuses_at_record():
    rng = np.random.default_rng(2)
    u, v = rng.random(16), np.zeros(16)
    with kadj.Tape() as tape:
        _refused(lambda: heat[(2,), (8, 2)](u, v, 0.25),
                 "heat (recorded on a kadj.Tape)[(2,), (8, 2)]")
        assert not v.any(), "the refused forward ran"
        heat[(2,), (8,)](u, v, 0.25)
    assert len(tape.launches) == 1
    ct = rng.standard_normal(16)
    tape.backward(seeds=[(v, ct)])
    ref, _ = _heat_reference(u, 0.25, ct)
    err = float(np.max(np.abs(tape.grad(u) - ref)))
    assert err < 1e-12, err
    return err


def case_read_dimension_beyond_coordinates():
    """cuda.grid(1) and threadIdx.y: the [(2,), (8, 2)] launch is the kernel's own; x is
    not thread-private (two threads load x[i]), so its adjoint is atomic."""
    from kadj.testing import check_grad_cuda
    args = _args(np.random.default_rng(3))["sum_by_row"]
    rep = sum_by_row.adjoint_report(*args)
    assert rep["arrays"]["x"]["accumulation"] == "atomic", rep["arrays"]["x"]
    x, ct = args[0], np.array([0.5, -1.5])
    gx = np.zeros_like(x)
    sum_by_row.adjoint[(2,), (8, 2)](x, np.zeros(2), gx, ct.copy())
    err = float(np.max(np.abs(gx - 2.0 * x * ct.sum())))
    assert err < 1e-12, err
    return max(err, check_grad_cuda(sum_by_row, ((2,), (8, 2)), args).max_abs_error)


def case_no_thread_index():
    """A kernel that reads no thread index runs with one thread."""
    ga = np.zeros(1)
    no_thread_index.adjoint[1, 1](0.7, np.zeros(1), ga, np.array([2.0]))
    err = abs(ga[0] - 2.0 * 0.7 * 2.0)
    assert err < 1e-12, ga
    _refused(lambda: no_thread_index.adjoint[1, 4](0.7, np.zeros(1), np.zeros(1),
                                                   np.ones(1)),
             "4 threads per block along x", "reads no thread or block index")
    return err


def case_single_writer_stores():
    """Refused stores are refused under the simulator too; guarded ones are right."""
    from kadj.testing import check_grad_cuda
    args = _args(np.random.default_rng(4))
    for name, phrase in REFUSED.items():
        _refused(lambda: globals()[name].compiled(*args[name]), phrase)
    worst = 0.0
    for name, cfg in (("bcast_guarded", (2, 8)), ("store_first", (2, 8)),
                      ("block_early_return", (2, 8))):
        worst = max(worst, check_grad_cuda(globals()[name], cfg,
                                           args[name]).max_abs_error)
    return worst


def case_non_contiguous_views():
    rng = np.random.default_rng(5)
    u = rng.random(16)
    base = np.zeros(32)
    adj_u, adj_v = base[::2], base[1::2]
    adj_v[...] = 1.0
    for launch, name in ((lambda: heat[2, 8](u, base[::2], 0.3),
                          "'v'"),
                         (lambda: heat.adjoint[2, 8](u, np.zeros(16), 0.3, adj_u, adj_v,
                                                     np.zeros(1)), "'adj_u'"),
                         (lambda: heat.adjoint[2, 8](np.zeros(32)[::2], np.zeros(16),
                                                     0.3, np.zeros(16), np.zeros(16),
                                                     np.zeros(1)), "'u'")):
        try:
            launch()
        except ValueError as exc:
            msg = str(exc)
            assert name in msg and "np.ascontiguousarray" in msg and "heat" in msg, msg
        else:
            raise AssertionError(f"a non-contiguous {name} was accepted")
    assert not base[::2].any() and (base[1::2] == 1.0).all(), "buffers written"
    return 0.0


CASES = {n[len("case_"):]: f for n, f in list(globals().items())
         if n.startswith("case_")}


@pytest.fixture(scope="module")
def sim_results():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), HERE,
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=600)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = line.split(" ", 3)
            out[name] = (status, rest)
    if not out:
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out, proc


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_simulator(sim_results, name):
    out, proc = sim_results
    if name not in out:
        pytest.fail(f"no result for {name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    status, detail = out[name]
    assert status == "OK", detail


def main():
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    for name, fn in CASES.items():
        try:
            err = fn()
            print(f"CASE {name} OK {err:.3e}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main()


def test_a_checked_launch_configuration_is_not_checked_again(monkeypatch):
    """``k.adjoint[config]`` checks a configuration once (the check formats the call's
    text: about 10 us); an invalid one is refused at every launch, and one that cannot
    be a dictionary key (lists in it) is checked every time."""
    from kadj import validate
    seen = []
    check = validate.check_launch
    monkeypatch.setattr(validate, "check_launch", lambda *a: seen.append(a) or check(*a))
    k = kadj.differentiate(heat.dispatcher)
    first = k.adjoint[(4,), (32,)]
    assert k.adjoint[(4,), (32,)] is first and len(seen) == 1
    for _ in range(2):
        with pytest.raises(ValueError, match="at least 1"):
            k.adjoint[(0,), (32,)]
    assert len(seen) == 3
    k.adjoint[[4], [32]]
    k.adjoint[[4], [32]]
    assert len(seen) == 5
    assert k.jvp[(4,), (32,)] is k.jvp[(4,), (32,)]
    assert k[(4,), (32,)] is k[(4,), (32,)]
    with pytest.raises(TypeError, match="launch configuration"):
        k[(4,)]
