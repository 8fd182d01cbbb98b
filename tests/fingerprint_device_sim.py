"""Device fingerprints (kadj.fingerprint.device_fingerprint, the hash kernel of
kadj.device_ops) and a tape's checks for unrecorded changes on the device
(kadj.tape_checks) in the CUDA simulator: run with NUMBA_ENABLE_CUDASIM=1 by
tests/test_fingerprint_device.py; prints one line "CASE <name> OK|FAIL <detail>" per
case."""
import sys
import warnings

import numpy as np
from numba import cuda

import kadj
from kadj.errors import DifferentiationError
from kadj.fingerprint import device_fingerprint, fingerprint
from cudatools import report_cases
from sim_counters import Counters, device_checks, pending_events

# the simulator runs the uint64 hash on NumPy scalars, which warn on (intended) wrapping
warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)

RNG = np.random.default_rng(3)


def changed(a, k):
    """A copy of host array ``a`` with element ``k`` (flat index) changed minimally."""
    b = a.copy()
    flat = b.reshape(-1)
    if flat.dtype.kind == "f":
        flat[k] = np.nextafter(flat[k], np.inf)
    else:
        flat[k] = flat[k] + 1
    return b


def equal_contents():
    a = RNG.random(40)
    f = device_fingerprint(cuda.to_device(a))
    assert f == device_fingerprint(cuda.to_device(a.copy())), "equal contents differ"
    assert f[:2] == ((40,), "<f8") and all(isinstance(x, int) for x in f[2:]), f
    hash(f)
    assert device_fingerprint(cuda.to_device(a.reshape(8, 5))) != f, "shape ignored"
    assert device_fingerprint(cuda.to_device(a.view(np.int64))) != f, "dtype ignored"
    assert device_fingerprint(cuda.to_device(np.zeros(0))) == \
        device_fingerprint(cuda.to_device(np.zeros(0))), "empty arrays differ"
    return 0.0


def single_changes():
    """One element changed, anywhere (first, middle, last, in the tail bytes of odd
    sizes), changes the fingerprint; 300 float64 span 3 blocks of the hash kernel."""
    arrays = [RNG.random(300),                                  # whole words, 3 blocks
              RNG.random(37).astype(np.float32),                # 4 tail bytes
              (np.arange(27) % 7).astype(np.int8),              # 3 tail bytes
              (RNG.random((3, 5)) * 100).astype(np.int16)]      # 2-D, 6 tail bytes
    count = 0
    for a in arrays:
        f0 = device_fingerprint(cuda.to_device(a))
        n = a.size
        for k in sorted({0, 1, n // 2, n - 2, n - 1}):
            f1 = device_fingerprint(cuda.to_device(changed(a, k)))
            assert f1 != f0, f"{a.dtype}[{n}]: change at {k} not detected"
            count += 1
    return float(count)


def permutations():
    a = RNG.random(64)
    f0 = device_fingerprint(cuda.to_device(a))
    for i, j in [(0, 1), (10, 11), (5, 60), (62, 63)]:
        b = a.copy()
        b[[i, j]] = b[[j, i]]
        assert device_fingerprint(cuda.to_device(b)) != f0, f"swap {i},{j} not detected"
    assert device_fingerprint(cuda.to_device(a[::-1].copy())) != f0, "reversal"
    assert device_fingerprint(cuda.to_device(np.roll(a, 1))) != f0, "roll"
    c = np.arange(16, dtype=np.int8)                    # two bytes of one word swapped
    d = c.copy()
    d[[2, 3]] = d[[3, 2]]
    assert device_fingerprint(cuda.to_device(d)) != device_fingerprint(cuda.to_device(c))
    return 0.0


def strided_and_misaligned():
    """Strided views hash their elements (through a contiguous device copy); a view
    starting off an 8-byte boundary is copied first; the source is left untouched."""
    a = RNG.random((6, 8))
    d = cuda.to_device(a)
    view = d[1:5, ::3]
    f = device_fingerprint(view)
    assert f == device_fingerprint(cuda.to_device(np.ascontiguousarray(a[1:5, ::3])))
    b = a.copy()
    b[0, 1] += 1.0                                     # outside the view
    assert device_fingerprint(cuda.to_device(b)[1:5, ::3]) == f, "outside change seen"
    b[4, 6] += 1.0                                     # inside it (row 4, column 6)
    assert device_fingerprint(cuda.to_device(b)[1:5, ::3]) != f, "inside change missed"
    assert np.array_equal(d.copy_to_host(), a), "the array was modified"
    x = RNG.random(21).astype(np.float32)
    dx = cuda.to_device(x)
    g = device_fingerprint(dx[1:])                     # 4-byte aligned start
    assert g == device_fingerprint(cuda.to_device(x[1:].copy()))
    dx[20:21].copy_to_device(np.array([7.0], np.float32))
    assert device_fingerprint(dx[1:]) != g, "change after a misaligned start missed"
    t = cuda.to_device(RNG.random((2, 3, 2, 2, 2)))   # 5-D strided: through the host
    assert device_fingerprint(t[:, ::2]) == \
        device_fingerprint(cuda.to_device(t.copy_to_host()[:, ::2].copy()))
    return 0.0


class CudaArrayLike:
    """An object known only by ``__cuda_array_interface__`` (as a CuPy array is)."""

    def __init__(self, dev):
        self.dev = dev

    @property
    def __cuda_array_interface__(self):
        return {"shape": tuple(self.dev.shape), "typestr": self.dev.dtype.str,
                "data": (self.dev._ary.ctypes.data, False), "strides": None,
                "version": 3}


def interface_objects():
    """fingerprint() hashes objects known by __cuda_array_interface__ on the device,
    through numba.cuda.as_cuda_array (given here: the simulator has none)."""
    seen = []

    def as_cuda_array(obj):
        seen.append(obj)
        return obj.dev

    cuda.as_cuda_array = as_cuda_array
    try:
        a = RNG.random(30)
        d = cuda.to_device(a)
        f = fingerprint(CudaArrayLike(d))
        assert seen and f == device_fingerprint(d), "not hashed on the device"
        d[29:30].copy_to_device(np.array([0.5]))
        assert fingerprint(CudaArrayLike(d)) != f, "change missed"
    finally:
        del cuda.as_cuda_array
    return 0.0


@kadj.differentiate
@cuda.jit
def scale(u, v, alpha):
    i = cuda.grid(1)
    if i < u.shape[0]:
        v[i] = alpha * u[i] * u[i]


@kadj.differentiate
@cuda.jit
def total(u, out):
    i = cuda.grid(1)
    if i < u.shape[0]:
        cuda.atomic.add(out, 0, u[i])


N = 8


def tape_sequence(change, checked=True):
    """scale(u0 -> u); change(u); scale(u -> v); total(v -> out), on device arrays."""
    d_u0 = cuda.to_device(np.linspace(0.5, 1.5, N))
    d_u, d_v = cuda.to_device(np.zeros(N)), cuda.to_device(np.zeros(N))
    out = cuda.to_device(np.zeros(1))
    with kadj.Tape(check_unrecorded_changes=checked) as tape:
        scale[1, N](d_u0, d_u, 0.5)
        change(d_u)
        scale[1, N](d_u, d_v, 0.5)
        total[1, N](d_v, out)
    return tape, d_u0, out


def want_grad():
    u0 = np.linspace(0.5, 1.5, N)
    return 0.5 * 2 * (0.5 * u0 * u0) * (0.5 * 2 * u0)      # d/du0 sum(a (a u0^2)^2)


def set_u0(d):
    d[0] = 5.0                  # an unrecorded change of a recorded device array


def raises(call, *needles):
    try:
        call()
    except DifferentiationError as exc:
        msg = str(exc)
    else:
        raise AssertionError(f"{call} did not raise")
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def tape_device_checks():
    """The device path (as on a GPU): recording and backward copy nothing to the host
    and never synchronise; unchanged arrays give the exact gradient; a change
    between launches or after the last one raises the named error once the (here
    synchronous) device is done."""
    with device_checks():
        with Counters() as c:
            tape, d_u0, out = tape_sequence(lambda d: None)
            tape.backward(out)
            g = tape.grad(d_u0)
        assert c.copies == 0 and c.syncs == 0, \
            f"{c.copies} copies to the host, {c.syncs} synchronisations"
        assert tape._flag is not None, "the device path was not taken"
        g = g.copy_to_host()
        assert np.allclose(g, want_grad(), rtol=1e-12, atol=0), (g, want_grad())
        tape.check()                                        # nothing changed
        assert tape.scalar_grads(), "no scalar gradients"
        # a change between launches: named at once by grad (the event is complete)
        with Counters() as c:
            tape, d_u0, out = tape_sequence(set_u0)
            tape.backward(out)
        assert c.copies == 0 and c.syncs == 0, "the backward waited for the device"
        where = ("'v' of launch #0 (kernel 'scale')", "detected at launch #1",
                 "filled with NaN", "record_custom")
        raises(lambda: tape.grad(d_u0), *where)
        raises(tape.check, *where)
        raises(lambda: tape.backward(out), *where)           # sticky until reset()
        # a change after the last launch: found by backward's comparisons
        tape, d_u0, out = tape_sequence(lambda d: None)
        out[0] = 1.0
        tape.backward(out)
        raises(tape.check, "after the last recorded launch", "'out' of launch #2")
        raises(tape.scalar_grads, "after the last recorded launch")
    return 0.0


def tape_device_pending():
    """While the device has not finished (events not complete): the gradients of a
    changed sequence read NaN, tape.grad does not wait, tape.check() waits and raises;
    once complete, tape.grad raises.  Without the check the gradient is plausible and
    wrong, which is what the check prevents."""
    with device_checks():
        tape, d_u0, out = tape_sequence(set_u0)
        with pending_events():
            with Counters() as c:
                tape.backward(out)
                g = tape.grad(d_u0)
            assert c.copies == 0 and c.syncs == 0, "backward or grad waited"
            g = g.copy_to_host()
            assert np.isnan(g).all(), f"not poisoned: {g}"
            raises(tape.check, "'v' of launch #0 (kernel 'scale')",
                   "detected at launch #1")
        tape, d_u0, out = tape_sequence(set_u0)
        with pending_events():
            tape.backward(out)
        raises(lambda: tape.grad(d_u0), "'v' of launch #0 (kernel 'scale')")
        tape.reset()
        tape.check()                                        # reset() forgets it
        tape, d_u0, out = tape_sequence(set_u0, checked=False)
        tape.backward(out)
        g = tape.grad(d_u0).copy_to_host()
        assert np.all(np.isfinite(g)) and not np.allclose(g, want_grad()), g
    return 0.0


def tape_host_fingerprints():
    """By default the simulator's arrays (host memory) are fingerprinted on the host:
    backward raises at once, naming the array."""
    tape, d_u0, out = tape_sequence(lambda d: None)
    tape.backward(out)
    assert np.allclose(tape.grad(d_u0).copy_to_host(), want_grad(), rtol=1e-12)
    assert tape._flag is None, "the device path was taken"
    tape, _, out = tape_sequence(set_u0)
    raises(lambda: tape.backward(out), "'v' of launch #0 (kernel 'scale')",
           "detected at launch #1", "record_custom")
    tape, _, out = tape_sequence(lambda d: None)
    out[0] = 1.0
    raises(lambda: tape.backward(out), "after the last recorded launch")
    return 0.0


def main(names):
    cases = {"equal_contents": equal_contents, "single_changes": single_changes,
             "permutations": permutations,
             "strided_and_misaligned": strided_and_misaligned,
             "interface_objects": interface_objects,
             "tape_device_checks": tape_device_checks,
             "tape_device_pending": tape_device_pending,
             "tape_host_fingerprints": tape_host_fingerprints}
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
