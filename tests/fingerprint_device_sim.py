"""Device fingerprints (kadj.fingerprint.device_fingerprint, the hash kernel of
kadj.device_ops) in the CUDA simulator: run with NUMBA_ENABLE_CUDASIM=1 by
tests/test_fingerprint_device.py; prints one line "CASE <name> OK|FAIL <detail>" per
case."""
import sys
import warnings

import numpy as np
from numba import cuda

import kadj
from kadj import tape_versions
from kadj.errors import DifferentiationError
from kadj.fingerprint import device_fingerprint, fingerprint

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


def tape_sequence(change):
    d_u0 = cuda.to_device(np.linspace(0.5, 1.5, N))
    d_u, d_v, out = (cuda.to_device(np.zeros(N)) for _ in range(3))
    out = cuda.to_device(np.zeros(1))
    with kadj.Tape() as tape:
        scale[1, N](d_u0, d_u, 0.5)
        change(d_u)
        scale[1, N](d_u, d_v, 0.5)
        total[1, N](d_v, out)
    return tape, d_u0, out


def tape_detects(device):
    """A change between two recorded launches on device arrays makes backward raise,
    naming the array; with ``device`` the tape's fingerprints of the simulator's
    arrays are computed by the device kernel (as on a GPU), else on the host."""
    saved = tape_versions.fingerprint
    calls = []
    if device:
        def counted(a):
            calls.append(a)
            return device_fingerprint(a)
        tape_versions.fingerprint = counted
    try:
        tape, d_u0, out = tape_sequence(lambda d: None)
        tape.backward(out)
        g = tape.grad(d_u0).copy_to_host()
        u0 = np.linspace(0.5, 1.5, N)
        want = 0.5 * 2 * (0.5 * u0 * u0) * (0.5 * 2 * u0)      # d/du0 sum(a (a u0^2)^2)
        assert np.allclose(g, want, rtol=1e-12), (g, want)
        tape, _, out = tape_sequence(
            lambda d: d[3:4].copy_to_device(np.array([5.0])))
        try:
            tape.backward(out)
        except DifferentiationError as exc:
            msg = str(exc)
        else:
            raise AssertionError("the unrecorded change was not detected")
        assert "'v' of launch #0 (kernel 'scale')" in msg, msg
        assert "detected at launch #1" in msg and "record_custom" in msg, msg
        tape, _, out = tape_sequence(lambda d: None)
        out[0:1].copy_to_device(np.array([1.0]))             # after the last launch
        try:
            tape.backward(out)
        except DifferentiationError as exc:
            assert "after the last recorded launch" in str(exc), str(exc)
        else:
            raise AssertionError("the change after the last launch was not detected")
    finally:
        tape_versions.fingerprint = saved
    assert bool(calls) == device, f"{len(calls)} device fingerprints taken"
    return float(len(calls))


def main(names):
    cases = {"equal_contents": equal_contents, "single_changes": single_changes,
             "permutations": permutations,
             "strided_and_misaligned": strided_and_misaligned,
             "interface_objects": interface_objects,
             "tape_device_fingerprints": lambda: tape_detects(True),
             "tape_host_fingerprints": lambda: tape_detects(False)}
    for name in names or cases:
        try:
            err = cases[name]()
            print(f"CASE {name} OK {err:.3e}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
