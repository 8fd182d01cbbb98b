"""kadj.checkpointed_loop with CUDA kernels in the simulator (run by
tests/test_checkpointed_cuda.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported).

Each case records the same launches twice, once with the steps inside
``kadj.checkpointed_loop`` and once launch by launch on a store-everything tape, and
compares the gradients.  Prints one line per case: ``CASE <name> OK <detail>`` or
``CASE <name> FAIL <message>``.
"""
import math
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray  # noqa: E402

import kadj  # noqa: E402
from kadj import checkpointing  # noqa: E402
from kadj.schedules import binomial_cost  # noqa: E402

N = 12
CONFIG = (2, 8)


@kadj.differentiate
@cuda.jit
def heat(u, v, alpha, f):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + f[i] * u[i] * u[i]


@kadj.differentiate
@cuda.jit
def blend(a, b, c, g, beta):
    i = cuda.grid(1)
    if i < a.shape[0]:
        c[i] = beta * a[i] * g[i] + (1.0 - beta) * b[i] * b[i]


@kadj.differentiate
@cuda.jit
def init(x, u):
    i = cuda.grid(1)
    if i < u.shape[0]:
        u[i] = math.sin(x[i])


@kadj.differentiate
@cuda.jit
def sqloss(u, target, out):
    i = cuda.grid(1)
    if i < u.shape[0]:
        d = u[i] - target[i]
        cuda.atomic.add(out, 0, d * d)


RNG = np.random.default_rng(11)
X0 = RNG.random(N)
F = RNG.random(N) * 0.02
G = RNG.random(N)
TARGET = RNG.random(N)


class HostCopies:
    """Counts device-to-host copies made while a checkpointed loop runs its forward
    sweep or its adjoint (the loop's own work, not the tape's around it): ``count``,
    and apart, ``host_arguments``, the simulator's write-backs of NumPy arrays passed
    to kernels (on a GPU, copies to the host as well)."""

    def __init__(self):
        self.inside = 0
        self.count = 0
        self.host_arguments = 0
        self._saved = []

    def __enter__(self):
        counter = self
        loop_cls = checkpointing._Loop
        for name in ("forward", "adjoint"):
            original = getattr(loop_cls, name)
            self._saved.append((loop_cls, name, original))

            def wrapped(self_, *args, _original=original):
                counter.inside += 1
                try:
                    return _original(self_, *args)
                finally:
                    counter.inside -= 1
            setattr(loop_cls, name, wrapped)
        original_copy = FakeCUDAArray.copy_to_host
        self._saved.append((FakeCUDAArray, "copy_to_host", original_copy))

        def copy_to_host(self_, *args, **kwargs):
            if counter.inside:
                caller = sys._getframe(1).f_code.co_filename
                if caller.endswith(os.path.join("simulator", "args.py")):
                    counter.host_arguments += 1
                else:
                    counter.count += 1
            return original_copy(self_, *args, **kwargs)
        FakeCUDAArray.copy_to_host = copy_to_host
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        return False


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def heat_run(n, s, checkpoint, device):
    """init(x0) -> n ping-pong heat steps -> loss, on device or NumPy arrays."""
    mk = cuda.to_device if device else (lambda a: a.copy())
    x0, f, target = mk(X0), mk(F), mk(TARGET)
    u0, v0, out = mk(np.zeros(N)), mk(np.zeros(N)), mk(np.zeros(1))

    def step(i, u, v):
        heat[CONFIG](u, v, 0.1, f)
        return v, u

    with kadj.Tape() as tape:
        init[CONFIG](x0, u0)
        if checkpoint:
            u, v = kadj.checkpointed_loop(step, (u0, v0), steps=n, snapshots=s)
        else:
            u, v = u0, v0
            for i in range(n):
                u, v = step(i, u, v)
        sqloss[CONFIG](u, target, out)
    tape.backward(out)
    return tape, (x0, f, target)


def close(got, ref, what):
    got, ref = host(got), host(ref)
    if not np.allclose(got, ref, rtol=1e-12, atol=1e-15):
        raise AssertionError(f"{what}: {got} != {ref}")
    return float(np.max(np.abs(got - ref)))


def heat_case(n, s, device):
    ref, ref_arrays = heat_run(n, s, False, device)
    with HostCopies() as copies:
        got, got_arrays = heat_run(n, s, True, device)
    err = 0.0
    for what, a, b in zip(("x0", "f", "target"), got_arrays, ref_arrays):
        g = got.grad(a)
        if device and not hasattr(g, "copy_to_host"):
            raise AssertionError(f"tape.grad({what}) of a device array is not on the "
                                 "device")
        err = max(err, close(g, ref.grad(b), what))
    if not np.abs(host(ref.grad(ref_arrays[1]))).max() > 0:
        raise AssertionError("the parameter f got no gradient: the test checks nothing")
    total = got.scalar_grad("alpha", kernel="heat")
    expected = ref.scalar_grad("alpha", kernel="heat")
    if not math.isclose(total, expected, rel_tol=1e-12, abs_tol=1e-15):
        raise AssertionError(f"alpha: {total} != {expected}")
    loop = got.launches[1].kernel
    if loop.executions != binomial_cost(n, s):
        raise AssertionError(f"{loop.executions} step executions, expected "
                             f"{binomial_cost(n, s)}")
    report = got.memory_report()
    (lp,) = report.loops
    if not 1 <= lp.peak_snapshots <= s:
        raise AssertionError(f"peak snapshots {lp.peak_snapshots} > {s}")
    if lp.peak_snapshots > 1 and lp.peak_snapshot_bytes != (lp.peak_snapshots - 1) * 2 \
            * N * 8:
        raise AssertionError(f"peak snapshot bytes {lp.peak_snapshot_bytes} for "
                             f"{lp.peak_snapshots} snapshots")
    if device:
        if set(report.by_level) - {"device"}:
            raise AssertionError(f"host snapshots of device arrays: {report.by_level}")
        # the only copy to the host: each scalar slot's total over the steps, once
        # per backward, into the tape's (host) buffer of that slot
        slots = sum(isinstance(key, str) for key in loop.inputs)
        if copies.count + copies.host_arguments > slots:
            raise AssertionError(f"the loop copied {copies.count} arrays to the host "
                                 f"and passed {copies.host_arguments} NumPy arrays to "
                                 f"kernels ({slots} scalar slots)")
    return f"{err:.1e} peak={lp.peak_snapshots}"


def rotation_run(n, s, checkpoint, repeat):
    """Three device buffers rotating, two launches per step; g read every third step."""
    a0, b0, c0 = cuda.to_device(X0), cuda.to_device(np.zeros(N)), \
        cuda.to_device(np.zeros(N))
    f, g, target, out = (cuda.to_device(F), cuda.to_device(G), cuda.to_device(TARGET),
                         cuda.to_device(np.zeros(1)))

    def step(i, a, b, c):
        heat[CONFIG](a, b, 0.05, f)
        if i % 3 == 0:
            blend[CONFIG](a, b, c, g, 0.3)
        else:
            blend[CONFIG](b, a, c, f, 0.6)
        return b, c, a

    with kadj.Tape() as tape:
        if checkpoint:
            a, b, c = kadj.checkpointed_loop(step, (a0, b0, c0), steps=n, snapshots=s)
        else:
            a, b, c = a0, b0, c0
            for i in range(n):
                a, b, c = step(i, a, b, c)
        sqloss[CONFIG](a, target, out)
    grads = []
    for _ in range(repeat):
        tape.zero()
        tape.backward(out)
        grads.append([host(tape.grad(x)) for x in (a0, f, g)])
    return tape, grads


def rotation_case(n, s):
    _, (ref,) = rotation_run(n, s, False, 1)
    tape, got = rotation_run(n, s, True, 2)
    err = 0.0
    for gg in got:
        for what, x, r in zip(("a0", "f", "g"), gg, ref):
            err = max(err, close(x, r, what))
    if not np.abs(ref[2]).max() > 0:
        raise AssertionError("g (read every third step) got no gradient")
    loop = tape.launches[0].kernel
    if loop.executions != 2 * binomial_cost(n, s) - 1:
        raise AssertionError(f"{loop.executions} step executions")
    return f"{err:.1e}"


def non_contiguous_state_case():
    u = cuda.to_device(np.zeros((N, 2)))
    v = cuda.to_device(np.zeros(N))
    with kadj.Tape():
        try:
            kadj.checkpointed_loop(lambda i, a, b: (b, a), (u[:, 0], v), steps=2,
                                   snapshots=1)
        except kadj.DifferentiationError as exc:
            if "not contiguous" not in str(exc):
                raise
            return "refused"
    raise AssertionError("a non-contiguous device state array was accepted")


CASES = {
    **{f"heat_device_{n}_{s}": (lambda n=n, s=s: heat_case(n, s, True))
       for n, s in ((1, 1), (2, 1), (5, 2), (12, 3))},
    **{f"heat_numpy_{n}_{s}": (lambda n=n, s=s: heat_case(n, s, False))
       for n, s in ((2, 1), (12, 3))},
    "rotation_device_7_2": lambda: rotation_case(7, 2),
    "non_contiguous_state": non_contiguous_state_case,
}


def main(names):
    for name in names or CASES:
        try:
            detail = CASES[name]()
            print(f"CASE {name} OK {detail}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
