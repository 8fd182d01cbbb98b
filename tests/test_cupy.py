"""CuPy arrays, accepted wherever device arrays are, without copies through the host.

Two parts.  The first runs everywhere: a stand-in ``cupy`` module and array type (its
type's module is ``cupy...``, as CuPy's is) check that :mod:`kadj.arrays`, the one
place that handles array kinds, classifies CuPy arrays and keeps their data on the
device: every operation goes through CuPy's own functions, and converting one to a
NumPy array, as a hidden host copy would, raises (as CuPy does).

The second needs CuPy and a CUDA device and is skipped otherwise, saying so: an
adjoint launch, a jvp launch, a Tape backward and ``check_grad_cuda`` on CuPy arrays,
each compared with float64 finite differences or the analytic gradient.
"""
import sys
import types as pytypes

import numpy as np
import pytest

from kadj import arrays


# ---- a stand-in for CuPy ---------------------------------------------------------------
class _Device:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeCupyArray:
    """Device data held in a NumPy array that kadj must never see directly."""

    __module__ = "cupy._core.core"

    def __init__(self, data, log):
        self._data, self._log = np.array(data, dtype=np.float64), log
        self.device = _Device()

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._data.shape, "strides": None, "typestr": "<f8",
                "data": (self._data.ctypes.data, False), "version": 3}

    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")

    def get(self):
        self._log.append("get")
        return self._data.copy()

    def copy(self):
        self._log.append("copy")
        return FakeCupyArray(self._data, self._log)

    def __setitem__(self, index, value):
        assert isinstance(value, FakeCupyArray), "assigned a non-device value"
        self._log.append("setitem")
        self._data[index] = value._data

    def __iadd__(self, other):
        assert isinstance(other, FakeCupyArray), "added a non-device value"
        self._log.append("iadd")
        self._data += other._data
        return self


@pytest.fixture
def fake_cupy(monkeypatch):
    log = []

    def asarray(a):
        log.append("asarray")
        if isinstance(a, FakeCupyArray):
            return a
        return FakeCupyArray(np.asarray(a), log)

    def zeros(shape, dtype):
        log.append("zeros")
        return FakeCupyArray(np.zeros(shape, dtype), log)

    def array(src, dtype=None, copy=True):
        log.append("array")
        return FakeCupyArray(src._data if isinstance(src, FakeCupyArray) else src, log)

    module = pytypes.ModuleType("cupy")
    module.asarray, module.zeros, module.array = asarray, zeros, array
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module, log


def test_cupy_kind_needs_the_cuda_array_interface():
    class NoInterface:          # CuPy's module name, no device array behind it
        __module__ = "cupy._core.core"

    class Foreign:              # another library's device array
        __module__ = "mylib.arrays"
        __cuda_array_interface__ = {"shape": (3,), "strides": None, "typestr": "<f8",
                                    "data": (0x2000, False), "version": 3}

    assert arrays.kind(NoInterface()) is None and not arrays.is_array(NoInterface())
    assert arrays.kind(Foreign()) == "device"
    a = FakeCupyArray(np.zeros(3), [])
    assert arrays.kind(a) == "cupy"
    assert arrays.describe(a) == "FakeCupyArray of shape (3,) and dtype float64"
    assert arrays.memory(a)[0] == "device"
    assert not arrays.overlap(a, a._data)       # device memory never overlaps host


def test_cupy_data_stays_on_the_device(fake_cupy):
    _, log = fake_cupy
    a = FakeCupyArray([1.0, 2.0, 3.0], log)
    z = arrays.zeros_like(a)
    assert arrays.kind(z) == "cupy" and log == ["zeros"]
    c = arrays.copy(a)
    assert arrays.kind(c) == "cupy" and c is not a and log[-1] == "copy"
    arrays.add_into(z, a)
    arrays.add_into(z, c)
    assert log[-2:] == ["iadd", "iadd"]
    arrays.copy_into(c, z)                      # device to device
    assert log[-1] == "setitem" and "get" not in log
    np.testing.assert_array_equal(c._data, [2.0, 4.0, 6.0])
    arrays.copy_into(c, np.array([7.0, 8.0, 9.0]))   # a NumPy source is uploaded
    assert log[-2:] == ["asarray", "setitem"]
    np.testing.assert_array_equal(c._data, [7.0, 8.0, 9.0])
    f = arrays.filled(a, np.array([4.0, 5.0, 6.0]))
    assert arrays.kind(f) == "cupy" and log[-1] == "array"
    assert "get" not in log                      # nothing went through the host
    np.testing.assert_array_equal(arrays.to_host(f), [4.0, 5.0, 6.0])
    assert log[-1] == "get"                      # only when asked for


# ---- on a GPU, with CuPy ---------------------------------------------------------------
def _cupy_and_device():
    cupy = pytest.importorskip("cupy", reason="needs CuPy and a CUDA device")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
        from numba import cuda
        if not cuda.is_available():
            raise RuntimeError("numba sees no device")
    except Exception as exc:
        pytest.skip(f"needs CuPy and a CUDA device ({exc})")
    return cupy


@pytest.fixture(scope="module")
def gpu():
    cupy = _cupy_and_device()
    import kadj
    from numba import cuda

    @kadj.differentiate
    @cuda.jit
    def scale_sq(x, y, a):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = a * x[i] * x[i]

    @kadj.differentiate
    @cuda.jit
    def total(y, loss):
        i = cuda.grid(1)
        if i < y.shape[0]:
            cuda.atomic.add(loss, 0, y[i])

    return pytypes.SimpleNamespace(cupy=cupy, kadj=kadj, scale_sq=scale_sq, total=total)


N, CONFIG = 100, (4, 32)


def _x():
    return np.linspace(0.5, 1.5, N)


def test_adjoint_launch_on_cupy_arrays(gpu):
    cp = gpu.cupy
    x, y = cp.asarray(_x()), cp.zeros(N)
    adj_x, adj_y, adj_a = cp.zeros(N), cp.ones(N), cp.zeros(1)
    gpu.scale_sq.adjoint[CONFIG](x, y, 0.7, adj_x, adj_y, adj_a)
    assert isinstance(adj_x, cp.ndarray)
    np.testing.assert_allclose(adj_x.get(), 2 * 0.7 * _x(), rtol=1e-12)
    np.testing.assert_allclose(adj_a.get()[0], np.sum(_x() ** 2), rtol=1e-12)
    np.testing.assert_array_equal(adj_y.get(), 0.0)    # y is overwritten: consumed


def test_jvp_launch_on_cupy_arrays(gpu):
    cp = gpu.cupy
    x, y = cp.asarray(_x()), cp.zeros(N)
    v = np.cos(np.arange(N))
    dot_x, dot_y, dot_a = cp.asarray(v), cp.zeros(N), cp.asarray([0.3])
    gpu.scale_sq.jvp[CONFIG](x, y, 0.7, dot_x, dot_y, dot_a)
    want = 2 * 0.7 * _x() * v + 0.3 * _x() ** 2
    np.testing.assert_allclose(dot_y.get(), want, rtol=1e-12)
    np.testing.assert_allclose(y.get(), 0.7 * _x() ** 2, rtol=1e-12)


def test_tape_backward_on_cupy_arrays(gpu):
    cp, kadj = gpu.cupy, gpu.kadj
    x, y, loss = cp.asarray(_x()), cp.zeros(N), cp.zeros(1)
    with kadj.Tape() as tape:
        gpu.scale_sq[CONFIG](x, y, 0.7)
        gpu.total[CONFIG](y, loss)
    tape.backward(loss)
    g = tape.grad(x)
    assert isinstance(g, cp.ndarray)                   # the gradient stays on the device
    np.testing.assert_allclose(g.get(), 2 * 0.7 * _x(), rtol=1e-12)
    np.testing.assert_allclose(tape.scalar_grad("a"), np.sum(_x() ** 2), rtol=1e-12)


def test_check_grad_on_cupy_arrays(gpu):
    cp, kadj = gpu.cupy, gpu.kadj
    result = kadj.testing.check_grad_cuda(gpu.scale_sq, CONFIG,
                                          [cp.asarray(_x()), cp.zeros(N), 0.7])
    # y's elements outside the launch keep their value: its state before is an input
    assert result.inputs == ("x", "y", "a") and result.outputs == ("y",)
    assert result.max_rel_error <= result.rtol     # (a mismatch raises AssertionError)
