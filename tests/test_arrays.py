"""kadj.arrays, the one place that knows kinds of arrays, checked against NumPy.

NumPy arrays and stand-ins for device arrays (objects exporting only
``__cuda_array_interface__``) are checked in this process; the CUDA simulator's device
arrays in a subprocess started with NUMBA_ENABLE_CUDASIM=1 (set before numba is
imported), which runs this file as a script.
"""
import itertools
import os
import subprocess
import sys
import traceback
import types as pytypes

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from kadj import arrays


def _views():
    """Views of one buffer: slices, steps, negative strides, transposes, broadcasts,
    a 0-d view, empty views, a reinterpreting view."""
    base = np.arange(48, dtype=np.float64)
    m = base.reshape(6, 8)
    return base, {
        "base": base, "all": base[:], "head": base[:10], "tail": base[40:],
        "evens": base[::2], "odds": base[1::2], "reversed": base[::-1],
        "rev_odds": base[-1::-2], "mid": base[10:20], "mid_rev": base[19:9:-1],
        "m": m, "mT": m.T, "col": m[:, 3], "block": m[1:3, 2:6], "block_neg": m[4:1:-1, ::-3],
        "bcast": np.broadcast_to(base[5:9], (3, 4)), "scalar": base[7:8].reshape(()),
        "empty": base[4:4], "empty_2d": m[2:2, :], "as_int": base.view(np.int64)[16:24],
        "rows_overlap": as_strided(base, (4, 3), (8, 8)),
        "other": np.zeros(8),
    }


def _offsets(x):
    """Byte offsets of every element of ``x``, from its pointer, shape and strides."""
    ptr = x.__array_interface__["data"][0]
    offs = np.zeros(1, dtype=np.int64)
    for n, s in zip(x.shape, x.strides):
        offs = (offs[:, None] + s * np.arange(n, dtype=np.int64)).ravel()
    return ptr + offs


def _bytes(x):
    return {int(o) + b for o in _offsets(x) for b in range(x.itemsize)}


# ---- kinds --------------------------------------------------------------------------------
class _CupyLike:
    """Classified by the module its type comes from, as CuPy arrays are."""

    __module__ = "cupy._core.core"

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


def _cai(ptr, shape, strides=None, readonly=False, typestr="<f8"):
    return {"shape": shape, "strides": strides, "typestr": typestr,
            "data": (ptr, readonly), "version": 3}


def _device(ptr, shape, strides=None, readonly=False, own_strides=None):
    """A stand-in for a device array: only ``__cuda_array_interface__`` (and, like
    numba's, its own ``strides`` when ``own_strides`` is given)."""
    ns = pytypes.SimpleNamespace(
        __cuda_array_interface__=_cai(ptr, shape, strides, readonly))
    if own_strides is not None:
        ns.strides = own_strides
    return ns


def test_kinds():
    assert arrays.kind(np.zeros(3)) == "host"
    assert arrays.kind(np.zeros((2, 2)).view(np.matrix)) == "host"
    assert arrays.kind(np.float64(1.0)) is None
    for value in (1.0, 3, None, [1.0, 2.0], (np.zeros(2),), "x"):
        assert arrays.kind(value) is None and not arrays.is_array(value)
    assert arrays.kind(_device(0x1000, (4,))) == "device"
    assert arrays.kind(_CupyLike(_cai(0x1000, (4,)))) == "cupy"
    fake_sim = pytypes.SimpleNamespace(_ary=np.zeros(3))
    assert arrays.kind(fake_sim) == "simulator"
    x, y = np.zeros(2), np.ones(3)
    assert [a is x or a is y for a in arrays.arrays_in((x, [1.0, (y,)], 2))] == [True, True]
    assert list(arrays.arrays_in(1.0)) == []


# ---- memory, host arrays ----------------------------------------------------------------
def test_memory_key_is_exact_view_identity():
    base, v = _views()
    named = list(v.items())
    for (na, a), (nb, b) in itertools.combinations(named, 2):
        same = arrays.memory_key(a) == arrays.memory_key(b)
        # equal keys exactly when both address the same elements, index by index,
        # with the same dtype
        want = (a.shape == b.shape and a.dtype == b.dtype and
                np.array_equal(_offsets(a), _offsets(b)))
        assert same == want, (na, nb)
    assert arrays.memory_key(base[2:6]) == arrays.memory_key(base[2:6])
    assert arrays.memory_key(base[2:6]) != arrays.memory_key(base[2:6].copy())


def test_span_bounds_every_element():
    _, v = _views()
    for name, x in v.items():
        space, lo, hi = arrays.span(x)
        assert space == "host"
        if x.size == 0:
            assert lo == hi, name
            continue
        offs = _offsets(x)
        assert (lo, hi) == (int(offs.min()), int(offs.max()) + x.itemsize), name


def test_overlap_and_may_overlap_agree_with_numpy():
    _, v = _views()
    for (na, a), (nb, b) in itertools.product(v.items(), repeat=2):
        assert arrays.overlap(a, b) == np.shares_memory(a, b), (na, nb)
        assert arrays.overlap(a, b) == bool(_bytes(a) & _bytes(b)), (na, nb)
        assert arrays.may_overlap(a, b) == np.may_share_memory(a, b), (na, nb)
    assert not arrays.overlap(v["base"], 3.0) and not arrays.overlap(None, v["base"])


def _crafted():
    """Two views whose bounds meet, with no shared element, that numpy's exact test
    needs many seconds to separate (they point beyond their buffer: never read)."""
    base = np.zeros(4)
    a = as_strided(base, (100, 100, 100),
                   tuple(8 * s for s in (106382645, 854408866, 681148805)))
    b = as_strided(base[1:], (100, 100, 100),
                   tuple(8 * s for s in (328022600, 852012294, 998418253)))
    return a, b


def test_overlap_is_bounded():
    a, b = _crafted()
    assert arrays.may_overlap(a, b)
    with pytest.raises(arrays.Undecided):
        arrays.overlap(a, b)
    assert not arrays.self_overlapping(a)


def test_self_overlapping_matches_element_offsets():
    base, v = _views()
    cases = dict(v)
    cases.update({
        "strides_below_item": as_strided(base, (4,), (4,)),
        "not_nested_disjoint": as_strided(base, (2, 3), (24, 16)),
        "not_nested_overlap": as_strided(base, (3, 3), (16, 24)),
        "zero_stride": as_strided(base, (5,), (0,)),
        "negative_bcast": np.broadcast_to(base[::-1][:3], (2, 3)),
    })
    for name, x in cases.items():
        offs = np.sort(_offsets(x))
        want = bool(np.any(np.diff(offs) < x.itemsize)) if x.size > 1 else False
        assert arrays.self_overlapping(x) == want, name
    assert arrays.self_overlapping(cases["bcast"])          # the test above can see one


def test_writeable_and_describe():
    x = np.zeros((2, 3))
    assert arrays.writeable(x)
    assert not arrays.writeable(np.broadcast_to(x, (4, 2, 3)))
    x.flags.writeable = False
    assert not arrays.writeable(x)
    assert arrays.writeable(_device(0x1000, (4,)))
    assert not arrays.writeable(_device(0x1000, (4,), readonly=True))
    assert arrays.describe(x) == "array of shape (2, 3) and dtype float64"
    assert arrays.describe(_device(0x1000, (4, 2))) == \
        "SimpleNamespace of shape (4, 2) and dtype float64"
    assert arrays.describe(3) == "int 3" and arrays.describe(None) == "NoneType"


# ---- memory, device arrays (read through __cuda_array_interface__) -----------------------
_DEVICE_BASE = 0x7F00_0000_0000


def _as_device(x, base, at):
    """A device stand-in with ``x``'s geometry, ``base`` (the start of ``x``'s buffer)
    moved to address ``at``."""
    ptr = x.__array_interface__["data"][0]
    return _device(ptr - base + at, x.shape, x.strides, own_strides=x.strides)


def test_device_arrays_tested_like_host_ones():
    base, v = _views()
    start = base.__array_interface__["data"][0]
    views = {n: x for n, x in v.items() if n != "other"}
    dev = {n: _as_device(x, start, _DEVICE_BASE) for n, x in views.items()}
    for (na, a), (nb, b) in itertools.product(views.items(), repeat=2):
        assert arrays.overlap(dev[na], dev[nb]) == np.shares_memory(a, b), (na, nb)
        assert arrays.may_overlap(dev[na], dev[nb]) == np.may_share_memory(a, b)
        assert (arrays.memory_key(dev[na]) == arrays.memory_key(dev[nb])) == \
            (arrays.memory_key(a) == arrays.memory_key(b)), (na, nb)
        # host and device memory never meet, whatever their addresses
        assert not arrays.overlap(a, _as_device(b, start, start))
        assert not arrays.may_overlap(a, _as_device(b, start, start))
    for name, x in views.items():
        assert arrays.self_overlapping(dev[name]) == arrays.self_overlapping(x), name
        space, lo, hi = arrays.span(dev[name])
        _, hlo, hhi = arrays.span(x)
        assert (space, lo - _DEVICE_BASE, hi - _DEVICE_BASE) == \
            ("device", hlo - start, hhi - start), name


def test_device_strides_none_means_c_order_unless_the_array_says_otherwise():
    c = _device(_DEVICE_BASE, (3, 4))                     # strides None: C order
    explicit = _device(_DEVICE_BASE, (3, 4), (32, 8))
    assert arrays.memory_key(c) == arrays.memory_key(explicit)
    assert arrays.overlap(c, explicit) and not arrays.self_overlapping(c)
    # numba reports strides None for a broadcast view too; its own strides tell
    bcast = _device(_DEVICE_BASE, (3, 4), None, own_strides=(0, 8))
    assert arrays.self_overlapping(bcast)
    assert arrays.memory_key(bcast) != arrays.memory_key(c)
    assert arrays.span(bcast) == ("device", _DEVICE_BASE, _DEVICE_BASE + 32)
    empty = _device(0, (0, 4))
    assert not arrays.overlap(empty, c) and not arrays.self_overlapping(empty)


# ---- data, host arrays ------------------------------------------------------------------
def test_copy_to_host_like_zeros_like_add_into_on_host():
    _, v = _views()
    for name, x in v.items():
        c = arrays.copy(x)
        assert type(c) is np.ndarray and c.shape == x.shape and c.dtype == x.dtype
        assert np.array_equal(c, x) and not np.shares_memory(c, x), name
        assert arrays.to_host(x) is x and arrays.like(x, c) is c
        z = arrays.zeros_like(x)
        assert z.shape == x.shape and z.dtype == x.dtype and z.flags.c_contiguous
        assert not np.any(z) and not np.shares_memory(z, x), name
        if x.dtype.kind == "f" and x.size:
            dst = np.ascontiguousarray(x) + 1.0
            want = dst + x
            arrays.add_into(dst, x)
            assert np.array_equal(dst, want), name


# ---- the CUDA simulator's device arrays (in a subprocess) --------------------------------
def _sim_kinds_and_memory():
    from numba import cuda
    h = np.arange(24, dtype=np.float64)
    d = cuda.to_device(h)
    assert arrays.kind(d) == "simulator" and arrays.is_array(d)
    assert arrays.kind(d[::2]) == "simulator"
    assert arrays.memory_key(d)[0] == "host"              # the simulator's memory
    assert arrays.memory_key(d[:]) == arrays.memory_key(d)
    assert arrays.memory_key(d[2:6]) == arrays.memory_key(d[2:6])
    assert arrays.memory_key(d[2:6]) != arrays.memory_key(h[2:6])   # a copy of h
    assert not arrays.overlap(d, h)
    slices = [slice(None), slice(None, None, 2), slice(1, None, 2), slice(None, None, -1),
              slice(5, 9), slice(8, 12), slice(4, 4), slice(9, 3, -3)]
    for sa, sb in itertools.product(slices, repeat=2):
        want = np.shares_memory(h[sa], h[sb])
        assert arrays.overlap(d[sa], d[sb]) == want, (sa, sb)
        assert arrays.may_overlap(d[sa], d[sb]) == np.may_share_memory(h[sa], h[sb])
        assert (arrays.memory_key(d[sa]) == arrays.memory_key(d[sb])) == \
            (arrays.memory_key(h[sa]) == arrays.memory_key(h[sb])), (sa, sb)
    m = cuda.to_device(h.reshape(4, 6))
    assert arrays.span(m.T)[1:] == arrays.span(m)[1:]
    assert arrays.overlap(m.T, m) and not arrays.self_overlapping(m.T)
    assert arrays.writeable(d)
    assert arrays.describe(d) == "FakeCUDAArray of shape (24,) and dtype float64"
    zero_d = cuda.to_device(np.array(2.5))
    assert arrays.memory_key(zero_d)[2] == () and not arrays.self_overlapping(zero_d)


def _sim_data():
    from numba import cuda
    h = np.arange(12, dtype=np.float64).reshape(3, 4)
    d = cuda.to_device(h)
    c = arrays.copy(d)
    assert arrays.kind(c) == "simulator" and not arrays.overlap(c, d)
    assert np.array_equal(arrays.to_host(c), h)
    back = arrays.to_host(d)
    assert type(back) is np.ndarray and np.array_equal(back, h)
    assert not np.shares_memory(back, d._ary)
    moved = arrays.like(d, np.ones((2, 2)))
    assert arrays.kind(moved) == "simulator"
    assert np.array_equal(arrays.to_host(moved), np.ones((2, 2)))
    for x in (d, d[:, ::2], d[::-1], cuda.to_device(np.array(1.5)), d[1:1]):
        z = arrays.zeros_like(x)
        assert arrays.kind(z) == "simulator" and z.shape == x.shape
        assert z.dtype == x.dtype and not np.any(arrays.to_host(z))
    dst = cuda.to_device(np.ones((3, 4)))
    arrays.add_into(dst, d)
    assert np.array_equal(arrays.to_host(dst), h + 1.0)
    assert np.array_equal(arrays.to_host(d), h)


def _product_kernel():
    import kadj

    # ``cuda`` is a global of this module (set by _main): kadj reads kernels' globals
    @kadj.differentiate
    @cuda.jit
    def product(a, b, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = a[i] * b[i]
    return product


def _sim_tape_same_array_twice():
    """A read-only device array passed twice gets two adjoint buffers, added on the
    device: d/dx sum(ct * x * x) = 2 ct x."""
    from numba import cuda

    import kadj
    product = _product_kernel()
    x = np.linspace(-1.0, 2.0, 10)
    ct = np.linspace(0.5, 1.5, 10)
    dx, dout = cuda.to_device(x), cuda.to_device(np.zeros(10))
    with kadj.Tape() as tape:
        product[2, 8](dx, dx, dout)
    tape.backward(seeds=[(dout, ct)])
    g = tape.grad(dx)
    assert arrays.kind(g) == "simulator"
    assert np.allclose(arrays.to_host(g), 2.0 * ct * x, rtol=1e-12, atol=0)


def _sim_check_grad_cuda_on_device_arrays():
    from numba import cuda

    from kadj.testing import check_grad_cuda
    product = _product_kernel()
    rng = np.random.default_rng(3)
    a, b = rng.random(10), rng.random(10)
    args = [cuda.to_device(a), cuda.to_device(b), cuda.to_device(np.zeros(10))]
    result = check_grad_cuda(product, (2, 8), args)
    assert result.inputs == ("a", "b", "out") and result.outputs == ("out",), result
    assert np.array_equal(args[0].copy_to_host(), a)
    assert not np.any(args[2].copy_to_host())


SIM_CASES = ["kinds_and_memory", "data", "tape_same_array_twice",
             "check_grad_cuda_on_device_arrays"]


@pytest.fixture(scope="module")
def sim_results():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), here,
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *SIM_CASES],
                          env=env, capture_output=True, text=True, timeout=300)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status = line.split(" ", 2)
            out[name] = status
    if not out:
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out, proc.stdout


@pytest.mark.parametrize("name", SIM_CASES)
def test_simulator_arrays(sim_results, name):
    out, stdout = sim_results
    assert out.get(name) == "ok", stdout


def _main(names):
    global cuda
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    from numba import cuda
    for name in names:
        try:
            globals()["_sim_" + name]()
            status = "ok"
        except Exception:
            status = "FAIL " + traceback.format_exc().replace("\n", " | ")
        print(f"CASE {name} {status}", flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
