"""Argument checks (kadj/validate.py) on every target.

Bad input gets one clear error naming the kernel, the argument and what to do, and
loses nothing: after every refused call the user's arrays (adjoint buffers included)
hold what they held before.  Gradients are compared with analytic formulas or float64
central differences.  The CUDA cases run in the simulator: this file, run as a script
with NUMBA_ENABLE_CUDASIM=1 set before numba is imported, prints one
``CASE <name> OK|FAIL <detail>`` line per case (as tests/cuda_sim_cases.py does).
"""
import math
import os
import re
import subprocess
import sys
import time
import types as pytypes

import numpy as np
import pytest
from numba import njit
from numpy.lib.stride_tricks import as_strided

import kadj
from kadj import rules, validate
from kadj.plan import AdjointPlan


# ---- helpers -----------------------------------------------------------------------------
def _snapshot(arrays):
    return [a.copy() for a in arrays]


def _refused(exc, match, fn, arrays):
    """``fn()`` raises ``exc`` matching ``match`` and leaves ``arrays`` unchanged."""
    before = _snapshot(arrays)
    with pytest.raises(exc, match=match) as info:
        fn()
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b, err_msg="a refused call modified an array")
    return str(info.value)


def _no_build(k):
    """Make compiling ``k``'s adjoint a test failure (checks must come first)."""
    def build(arg_types):
        raise AssertionError(f"{k.__name__}'s adjoint was compiled for {arg_types}")
    k._build = build
    return k


# ---- the kernel most cases use -----------------------------------------------------------
@njit
def axpy(x, y, a=0.5):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def _axpy_reference(x, a, ct_y):
    """Analytic adjoint of axpy for the cotangent ct_y of y after the call:
    (adj_x, adj_y before the call, adj_a)."""
    return a * ct_y, ct_y.copy(), float(np.dot(x, ct_y))


@pytest.fixture(scope="module")
def k():
    return kadj.differentiate(axpy)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal(6), rng.standard_normal(6), rng.standard_normal(6)


def _bufs(n=6):
    return [np.zeros(n), np.zeros(n), np.zeros(1)]


# ---- 1. adjoint buffers ------------------------------------------------------------------
def test_stride0_buffers_are_refused(k, data):
    x, y, ct = data
    stuck = as_strided(np.zeros(1), (6,), (0,))          # writeable, one element six times
    assert stuck.flags.writeable
    broadcast = np.broadcast_to(np.zeros(1), (6,))
    broadcast.flags.writeable = True
    for bad in (stuck, broadcast):
        bufs = [bad, ct.copy(), np.zeros(1)]
        msg = _refused(ValueError, "share memory", lambda: k.adjoint(x, y, 0.3, *bufs),
                       [x, y, *bufs])
        assert "axpy" in msg and "adj_x" in msg and "np.zeros_like(x)" in msg, msg


def test_written_argument_with_stride0_is_refused(k, data):
    x, _, ct = data
    y = as_strided(np.zeros(1), (6,), (0,))
    bufs = [np.zeros(6), ct.copy(), np.zeros(1)]
    msg = _refused(ValueError, "'y' is written", lambda: k.adjoint(x, y, 0.3, *bufs),
                   [x, *bufs])
    assert "y.copy()" in msg


def test_overlapping_buffers_and_arguments(k, data):
    x, y, ct = data
    # adjoint buffers overlapping each other (not the same view)
    store = np.zeros(12)
    bufs = [store[:6], store[3:9], np.zeros(1)]
    _refused(ValueError, "adj_x and adj_y share memory",
             lambda: k.adjoint(x, y, 0.3, *bufs), [x, y, store])
    # a buffer overlapping a forward argument the kernel only reads
    big = np.linspace(0.0, 1.0, 10)
    xv = big[2:8]
    bufs = [big[:6], ct.copy(), np.zeros(1)]
    msg = _refused(ValueError, "shares memory with the forward argument 'x'",
                   lambda: k.adjoint(xv, y, 0.3, *bufs), [big, y, bufs[1], bufs[2]])
    assert "np.zeros_like(x)" in msg
    # the scalar's buffer inside a forward array
    bufs = [np.zeros(6), ct.copy(), y[:1]]
    _refused(ValueError, "adj_a shares memory with the forward argument 'y'",
             lambda: k.adjoint(x, y, 0.3, *bufs), [x, y, bufs[0], bufs[1]])


def test_aliased_forward_arguments(k):
    base = np.linspace(-1.0, 1.0, 9)
    bufs = _bufs()
    msg = _refused(ValueError, "overlaps 'y', an array the kernel writes",
                   lambda: k.adjoint(base[:6], base[3:], 0.3, *bufs), [base, *bufs])
    assert "'x'" in msg


def test_interleaved_views_are_accepted_and_exact(k, data):
    """Views that share a base but no element pass (the exact test, not the bounds)."""
    x, y, ct = data
    xy = np.empty(12)
    xy[::2], xy[1::2] = x, y
    adj = np.zeros(12)
    adj[1::2] = ct
    a = 0.3
    out_a = np.zeros(1)
    k.adjoint(xy[::2], xy[1::2], a, adj[::2], adj[1::2], out_a)
    ref_x, ref_y, ref_a = _axpy_reference(x, a, ct)
    np.testing.assert_allclose(adj[::2], ref_x, rtol=1e-14)
    np.testing.assert_allclose(adj[1::2], ref_y, rtol=1e-14)
    np.testing.assert_allclose(out_a[0], ref_a, rtol=1e-12)
    np.testing.assert_array_equal(xy[::2], x)
    np.testing.assert_array_equal(xy[1::2], y)


def test_buffer_types_shapes_dtypes(k, data):
    x, y, ct = data
    arrays = [x, y, ct]
    _refused(TypeError, "adj_x must be a NumPy array, got list",
             lambda: k.adjoint(x, y, 0.3, [0.0] * 6, ct, np.zeros(1)), arrays)
    _refused(ValueError, r"adj_a \(the adjoint of the scalar a\) must be a 1-element",
             lambda: k.adjoint(x, y, 0.3, np.zeros(6), ct, np.zeros(())), arrays)
    fake_device = pytypes.SimpleNamespace(__cuda_array_interface__=_cai(0x10000, (6,)),
                                          shape=(6,), dtype=np.float64)
    _refused(TypeError, "must be a NumPy array", lambda: k.adjoint(
        x, y, 0.3, fake_device, ct, np.zeros(1)), arrays)


# ---- 2. the bounded overlap test ---------------------------------------------------------
# Two 3-D views of one buffer with large co-prime strides: their bounds meet, they share no
# element, and numpy's exact test takes many seconds to prove it.  The arrays point far
# beyond their buffer, so nothing may ever read them: the kernel below touches no element
# (n = 0) even if the check were to let the call through.
def _crafted():
    base = np.zeros(4)
    a = as_strided(base, (100, 100, 100), tuple(8 * s for s in (106382645, 854408866,
                                                                681148805)))
    b = as_strided(base[1:], (100, 100, 100), tuple(8 * s for s in (328022600, 852012294,
                                                                     998418253)))
    return a, b


@njit
def first_column(x, y, n):
    for i in range(n):
        y[i, 0, 0] = 2.0 * x[i, 0, 0]


def test_overlap_test_is_bounded():
    a, b = _crafted()
    assert np.may_share_memory(a, b)
    t = time.perf_counter()
    with pytest.raises(validate.Undecided):
        validate.overlap(a, b)
    assert not validate.self_overlapping(a) and not validate.self_overlapping(b)
    assert time.perf_counter() - t < 2.0


def test_undecidable_overlap_is_refused_quickly():
    k3 = kadj.differentiate(first_column)
    x, y = np.zeros((100, 100, 100)), np.zeros((100, 100, 100))
    k3.adjoint_plan(x, y, 0)                     # compile first: time only the checks
    adj_x, adj_y = _crafted()
    t = time.perf_counter()
    msg = _refused(ValueError, "cannot tell cheaply whether adj_x and adj_y share memory",
                   lambda: k3.adjoint(x, y, 0, adj_x, adj_y), [x, y])
    assert time.perf_counter() - t < 2.0
    assert "first_column" in msg and "np.ascontiguousarray" in msg


def test_self_overlap_of_unusual_layouts():
    base = np.zeros(64)
    # rows overlap: row stride one element, three elements a row
    assert validate.self_overlapping(as_strided(base, (4, 3), (8, 8)))
    # strides below the item size
    assert validate.self_overlapping(as_strided(base, (4,), (4,)))
    # a layout that is not nested but has disjoint elements: offsets 0,16,32 + 0,24
    assert not validate.self_overlapping(as_strided(base, (2, 3), (24, 16)))
    assert not validate.self_overlapping(base[::3].reshape(-1, 1)[::2])


# ---- device arrays (pointer ranges through __cuda_array_interface__) ---------------------
def _cai(ptr, shape, strides=None, readonly=False, typestr="<f8"):
    return {"shape": shape, "strides": strides, "typestr": typestr,
            "data": (ptr, readonly), "version": 3}


def _device(ptr, shape, strides=None, readonly=False):
    """A stand-in for a device array: the checks read only its interface."""
    return pytypes.SimpleNamespace(
        __cuda_array_interface__=_cai(ptr, shape, strides, readonly), shape=shape,
        dtype=np.dtype(np.float64), strides=strides)


def test_device_pointer_ranges():
    base = 0x7F00_0000_0000
    a = _device(base, (8,))
    assert validate.overlap(a, _device(base + 8 * 7, (4,)))         # last element shared
    assert not validate.overlap(a, _device(base + 8 * 8, (4,)))     # adjacent
    evens = _device(base, (4,), (16,))
    odds = _device(base + 8, (4,), (16,))
    assert not validate.overlap(evens, odds)                        # interleaved
    assert validate.overlap(evens, _device(base + 16, (2,)))
    assert validate.self_overlapping(_device(base, (4,), (0,)))
    assert not validate.self_overlapping(a)
    # host and device memory never meet, whatever their addresses
    host = np.zeros(4)
    assert not validate.overlap(host, _device(host.__array_interface__["data"][0], (4,)))


def test_device_buffers_checked_like_host_ones():
    base = 0x7F00_0000_0000
    plan = AdjointPlan("dev", ("u", "v", "c"), (0, 1, 2), frozenset({1}), frozenset({0}),
                       False)
    u, v = _device(base, (8,)), _device(base + 64, (8,))
    fresh = [_device(base + 4096 * k, s) for k, s in ((1, (8,)), (2, (8,)), (3, (1,)))]
    validate.check_adjoint_call("dev.adjoint", plan, (u, v, 0.5), fresh)   # accepted
    bad = [
        ([_device(base + 32, (8,)), fresh[1], fresh[2]],
         "adj_u shares memory with the forward argument 'u'"),
        ([fresh[0], _device(base + 4096 + 8, (8,)), fresh[2]],
         "adj_u and adj_v share memory"),
        ([_device(base + 4096, (8,), (0,)), fresh[1], fresh[2]], "share memory"),
        ([fresh[0], fresh[1], _device(base + 9999 * 8, (1,), readonly=True)],
         "adj_c is read-only"),
        ([fresh[0], _device(base + 8192, (7,)), fresh[2]], "shape and dtype of v"),
    ]
    for bufs, match in bad:
        with pytest.raises(ValueError, match=match):
            validate.check_adjoint_call("dev.adjoint", plan, (u, v, 0.5), bufs)
    with pytest.raises(ValueError, match="'u' overlaps 'v', an array the kernel writes"):
        validate.check_adjoint_call("dev.adjoint", plan,
                                    (u, _device(base + 8, (8,)), 0.5), fresh)


# ---- 3. launch configurations ------------------------------------------------------------
@pytest.mark.parametrize("config,exc,match", [
    ((0, 32), ValueError, "grid dimension x is 0"),
    (((4, 0), 32), ValueError, "grid dimension y is 0"),
    ((4, -1), ValueError, "block dimension x is -1"),
    ((4.0, 32), TypeError, "grid dimensions must be 1 to 3 integers"),
    ((4, (8, 8.5)), TypeError, "block dimensions must be 1 to 3 integers"),
    ((True, 32), TypeError, "integers"),
    ((4, 2000), ValueError, "at most 1024"),
    ((4, (32, 33)), ValueError, "1056 threads"),
    ((4, (1, 1, 65)), ValueError, "block dimension z is 65"),
    ((4, (1, 2, 3, 4)), TypeError, "1 to 3 integers"),
    (8, TypeError, r"needs a launch configuration \[grid, block\]"),
])
def test_launch_configuration_refused(config, exc, match):
    with pytest.raises(exc, match=match) as info:
        validate.check_launch("heat.adjoint", config)
    assert "heat.adjoint" in str(info.value)


def test_launch_configuration_accepted():
    assert validate.check_launch("k", (np.int64(3), (32, np.int32(4)))) == ((3, 1, 1),
                                                                          (32, 4, 1))
    assert validate.check_launch("k", (2, 1024, 0, 0)) == ((2, 1, 1), (1024, 1, 1))


# ---- 4. bad arguments: one sentence, before anything is compiled -------------------------
def test_unsupported_arguments_refused_before_compiling(data):
    x, y, ct = data
    cases = [
        ((x.astype(np.float16), y, 0.3),
         "'x' is a float16 array.*x.astype\\(np.float32\\)"),
        ((x, y, np.float16(0.3)), "'a' is a float16 scalar"),
        ((x.astype(">f8"), y, 0.3), "'x' has non-native byte order.*astype\\('float64'\\)"),
        ((list(x), y, 0.3), "'x' is a Python list.*np.asarray\\(x\\)"),
        ((x.astype(object), y, 0.3), "'x' is an object array"),
        (({"x": x}, y, 0.3), "'x' is a dict, which numba cannot pass"),
        (((x, y), y, 0.3), "'x' is a tuple holding arrays.*separate arguments"),
    ]
    for args, match in cases:
        k = _no_build(kadj.differentiate(axpy))
        bufs = _bufs()
        arrays = [a for a in args if isinstance(a, np.ndarray)] + bufs
        msg = _refused(TypeError, match, lambda: k.adjoint(*args, *bufs), arrays)
        assert msg.startswith("axpy"), msg
        _refused(TypeError, match, lambda: k.adjoint_plan(*args), arrays)


def test_forward_errors_name_the_argument(data):
    k = kadj.differentiate(axpy)
    x, y, _ = data
    _refused(TypeError, "axpy: argument 'x' is a float16 array",
             lambda: k(x.astype(np.float16), y.astype(np.float16), 0.3), [x, y])
    _refused(TypeError, "axpy: argument 'x' has non-native byte order",
             lambda: k(x.astype(">f8"), y, 0.3), [x, y])
    _refused(TypeError, "axpy: argument 'x' is None.*pass an array",
             lambda: k(None, y, 0.3), [y])


def test_none_argument_on_adjoint(k, data):
    _, y, ct = data
    bufs = _bufs()
    _refused(TypeError, "axpy: argument 'x' is None, which the kernel cannot use",
             lambda: k.adjoint(None, y, 0.3, *bufs), [y, *bufs])


def test_keyword_arguments_forward(k, data):
    x, y, _ = data
    got, want = y.copy(), y.copy()
    k(x, y=got, a=0.3)
    axpy.py_func(x, want, 0.3)
    np.testing.assert_allclose(got, want, rtol=1e-15)
    got = y.copy()
    k(x, got)                                   # the default a=0.5
    np.testing.assert_allclose(got, 0.5 * x + y, rtol=1e-15)
    _refused(TypeError, "axpy got an unexpected keyword argument 'b'",
             lambda: k(x, y, b=1.0), [x, y])
    _refused(TypeError, "axpy got two values for argument 'x'",
             lambda: k(x, y, x=x), [x, y])


def test_keyword_arguments_adjoint(k, data):
    x, y, ct = data
    ref_x, ref_y, ref_a = _axpy_reference(x, 0.5, ct)
    # forward arguments by name, the default a filled in, adjoints as adj_<name>=
    adj_x, adj_y, adj_a = np.zeros(6), ct.copy(), np.zeros(1)
    k.adjoint(x, y=y, adj_a=adj_a, adj_y=adj_y, adj_x=adj_x)
    np.testing.assert_allclose(adj_x, ref_x, rtol=1e-14)
    np.testing.assert_allclose(adj_y, ref_y, rtol=1e-14)
    np.testing.assert_allclose(adj_a[0], ref_a, rtol=1e-12)
    # positional adjoints followed by keyword ones
    adj_x, adj_y, adj_a = np.zeros(6), ct.copy(), np.zeros(1)
    k.adjoint(x, y, 0.5, adj_x, adj_a=adj_a, adj_y=adj_y)
    np.testing.assert_allclose(adj_x, ref_x, rtol=1e-14)
    np.testing.assert_allclose(adj_a[0], ref_a, rtol=1e-12)
    bufs = _bufs()
    _refused(TypeError, "unexpected keyword argument 'adj_z'",
             lambda: k.adjoint(x, y, 0.5, adj_z=bufs[0]), [x, y, *bufs])
    _refused(TypeError, "got adj_x by position and by keyword",
             lambda: k.adjoint(x, y, 0.5, bufs[0], adj_x=bufs[1]), [x, y, *bufs])
    _refused(TypeError, r"missing adjoint argument\(s\) \('adj_a',\)",
             lambda: k.adjoint(x, y, 0.5, adj_x=bufs[0], adj_y=bufs[1]), [x, y, *bufs])


def test_adjoints_in_place_of_a_default(k, data):
    """Adjoints passed positionally where a defaulted forward argument belongs."""
    x, y, ct = data
    bufs = _bufs()
    msg = _refused(TypeError, r"argument 'a' \(default 0.5\) got an array",
                   lambda: k.adjoint(x, y, *bufs), [x, y, *bufs])
    assert "adj_<name>=" in msg


def test_integer_scalar_has_no_slot(k, data):
    x, y, ct = data
    bufs = _bufs()
    msg = _refused(TypeError, r"expects 2 adjoint argument\(s\)",
                   lambda: k.adjoint(x, y, 1, *bufs), [x, y, *bufs])
    assert "'a' is the integer 1" in msg and "pass 1.0" in msg


@njit
def energy(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


def test_adj_return_number_or_one_element_array(data):
    """adj_return= takes a number, a 0-d or a 1-element array (a scalar's adjoint
    slot); anything else is refused naming adj_return."""
    k = kadj.differentiate(energy)
    x, _, _ = data
    for seed in (2.0, 2, np.float32(2.0), np.array(2.0), np.array([2.0])):
        g = np.zeros(6)
        assert k.adjoint(x, g, adj_return=seed) == pytest.approx(float(np.dot(x, x)))
        np.testing.assert_allclose(g, 4.0 * x, rtol=1e-15)
    for bad in ("a", np.zeros(2), np.zeros((1, 1)), [2.0], None, True):
        g = np.zeros(6)
        msg = _refused(TypeError, r"^energy.adjoint: adj_return must be a number",
                       lambda: k.adjoint(x, g, adj_return=bad), [x, g])
        assert "adj_return=1.0" in msg


def test_adj_return_on_a_kernel_that_returns_nothing(k, data):
    """Given explicitly, adj_return is refused on a kernel returning no float (it was
    ignored); the default stays accepted."""
    x, y, ct = data
    bufs = [np.zeros(6), ct.copy(), np.zeros(1)]
    msg = _refused(TypeError, r"^axpy.adjoint got adj_return=5.0, but axpy returns no "
                   "floating-point value", lambda: k.adjoint(x, y, 0.3, *bufs,
                                                             adj_return=5.0),
                   [x, y, *bufs])
    assert "leave it out" in msg
    k.adjoint(x, y, 0.3, *bufs)
    ref_x, _, ref_a = _axpy_reference(x, 0.3, ct)
    np.testing.assert_allclose(bufs[0], ref_x, rtol=1e-14)
    np.testing.assert_allclose(bufs[2][0], ref_a, rtol=1e-12)


def test_read_only_written_argument(data):
    """A read-only array the kernel writes: one sentence naming it and the line that
    writes it, from the forward, the adjoint, jvp and a Tape (numba's TypingError
    before); a read-only array the kernel only reads is accepted."""
    k = kadj.differentiate(axpy)
    x, y, ct = data
    ro_x, ro_y = x.copy(), y.copy()
    ro_x.flags.writeable = ro_y.flags.writeable = False
    line = axpy.py_func.__code__.co_firstlineno + 3
    where = f"{re.escape(__file__)}:{line}"
    bufs = _bufs()
    for call, fn in [("axpy", lambda: k(x, ro_y, 0.3)),
                     ("axpy", lambda: k.adjoint(x, ro_y, 0.3, *bufs)),
                     ("axpy.jvp", lambda: k.jvp(x, ro_y, 0.3, *bufs)),
                     ("axpy", lambda: k(ro_x, ro_y, 0.3))]:
        msg = _refused(ValueError, rf"^{call}: argument 'y' is read-only \(y.flags."
                       rf"writeable is False\), but the kernel writes into it at {where}",
                       fn, [x, ro_x, ro_y, *bufs])
        assert "y.copy()" in msg
    with kadj.Tape() as tape:
        _refused(ValueError, "argument 'y' is read-only", lambda: k(x, ro_y, 0.3),
                 [x, ro_y])
    assert not tape.launches
    bufs = [np.zeros(6), ct.copy(), np.zeros(1)]
    k.adjoint(ro_x, y, 0.3, *bufs)             # read only: accepted
    ref_x, _, ref_a = _axpy_reference(x, 0.3, ct)
    np.testing.assert_allclose(bufs[0], ref_x, rtol=1e-14)
    np.testing.assert_allclose(bufs[2][0], ref_a, rtol=1e-12)


# ---- a None default: omitted on the forward, given explicitly on the adjoint -------------
@njit
def scaled_product(x, y, out, scale=None):
    s = 2.0 if scale is None else scale
    for i in range(x.shape[0]):
        out[i] = s * x[i] * y[i] * y[i]


@njit
def square_with_option(x, out, w=None):
    for i in range(x.shape[0]):
        out[i] = x[i] * x[i]


def _product_fd(x, y, scale, ct, eps=1e-6):
    """Central differences of sum(ct * out) for scaled_product: (d/dx, d/dy)."""
    def loss(xx, yy):
        out = np.zeros_like(xx)
        scaled_product.py_func(xx, yy, out, scale)
        return float(np.dot(ct, out))
    gx, gy = np.zeros_like(x), np.zeros_like(y)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        gx[i] = (loss(x + e, y) - loss(x - e, y)) / (2 * eps)
        gy[i] = (loss(x, y + e) - loss(x, y - e)) / (2 * eps)
    return gx, gy


def test_none_default_forward_and_adjoint(data):
    k = kadj.differentiate(scaled_product)
    x, y, ct = data
    out = np.zeros(6)
    k(x, y, out)                                   # the default filled in
    np.testing.assert_allclose(out, 2.0 * x * y * y, rtol=1e-15)
    k(x, y, out, 3.0)
    np.testing.assert_allclose(out, 3.0 * x * y * y, rtol=1e-15)
    fx, fy = _product_fd(x, y, None, ct)
    # the default passed explicitly, then positional adjoints
    ax, ay, aout = np.zeros(6), np.zeros(6), ct.copy()
    k.adjoint(x, y, out, None, ax, ay, aout)
    np.testing.assert_allclose(ax, fx, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ay, fy, rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(aout, np.zeros(6))   # out is overwritten
    # the default omitted, adjoints by keyword
    ax, ay, aout = np.zeros(6), np.zeros(6), ct.copy()
    k.adjoint(x, y, out, adj_x=ax, adj_y=ay, adj_out=aout)
    np.testing.assert_allclose(ax, fx, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ay, fy, rtol=1e-7, atol=1e-9)
    # a float in its place: a differentiable scalar, with its own adjoint slot
    fx3, _ = _product_fd(x, y, 3.0, ct)
    ax, ay, aout, ascale = np.zeros(6), np.zeros(6), ct.copy(), np.zeros(1)
    k.adjoint(x, y, out, 3.0, ax, ay, aout, ascale)
    np.testing.assert_allclose(ax, fx3, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ascale[0], float(np.dot(ct, x * y * y)), rtol=1e-12)


def test_none_default_left_out_before_positional_adjoints(data):
    """The adjoints move into the omitted default's place: refused, naming it."""
    k = kadj.differentiate(scaled_product)
    x, y, ct = data
    out = np.zeros(6)
    bufs = [np.zeros(6), np.zeros(6), ct.copy()]
    msg = _refused(TypeError, r"^scaled_product.adjoint: argument 'scale' \(default None\) "
                   "got an array, probably an adjoint",
                   lambda: k.adjoint(x, y, out, *bufs), [x, y, out, *bufs])
    assert "Pass 'scale' explicitly (None for the default)" in msg
    assert "adj_<name>=" in msg
    # one positional adjoint, the others by keyword: the same
    _refused(TypeError, r"argument 'scale' \(default None\) got an array",
             lambda: k.adjoint(x, y, out, bufs[0], adj_y=bufs[1], adj_out=bufs[2]),
             [x, y, out, *bufs])
    # the kernel types with an array there, but the adjoints are too few
    k2 = kadj.differentiate(square_with_option)
    bufs = [np.zeros(6), ct.copy()]
    msg = _refused(TypeError, r"argument 'w' \(default None\) got an array, probably an "
                   r"adjoint \(square_with_option.adjoint expects 3 adjoint argument",
                   lambda: k2.adjoint(x, out, *bufs), [x, out, *bufs])
    # and the refused calls left the kernel usable
    ax, aout = np.zeros(6), ct.copy()
    k2.adjoint(x, out, None, ax, aout)
    np.testing.assert_allclose(ax, 2.0 * x * ct, rtol=1e-14)


def test_optional_array_argument_both_ways(data):
    """``w is None`` on an array argument is decided by its type (numba types it so):
    the kernel differentiates with the array given and with None; adjoints slipped into
    its place are refused, naming it."""
    @njit
    def pick(x, out, w=None):
        for i in range(x.shape[0]):
            out[i] = x[i] * (1.0 if w is None else w[i])
    k = kadj.differentiate(pick)
    x, y, ct = data
    out, bufs = np.zeros(6), [np.zeros(6), ct.copy()]
    _refused(TypeError, r"argument 'w' \(default None\) got an array, probably an adjoint",
             lambda: k.adjoint(x, out, *bufs), [x, out, *bufs])
    ax, aout = np.zeros(6), ct.copy()
    k.adjoint(x, out, None, ax, aout)
    np.testing.assert_allclose(ax, ct, rtol=1e-15)
    ax, aout, aw = np.zeros(6), ct.copy(), np.zeros(6)
    k.adjoint(x, out, y, ax, aout, aw)
    np.testing.assert_allclose(ax, y * ct, rtol=1e-15)
    np.testing.assert_allclose(aw, x * ct, rtol=1e-15)


def test_numeric_defaults_left_out_with_as_many_arguments_as_parameters(data):
    """k(x, y, a=0.5, p=2).adjoint(x, y, adj_x, adj_y): the adjoints take the places
    of a and p (as many positional arguments as parameters); refused naming 'a' (was
    numba's raw TypingError)."""
    @njit
    def power(x, y, a=0.5, p=2):
        for i in range(x.shape[0]):
            y[i] = a * x[i] ** p
    k = kadj.differentiate(power)
    x, _, ct = data
    bufs = [np.zeros(6), ct.copy()]
    _refused(TypeError, r"^power.adjoint: argument 'a' \(default 0.5\) got an array",
             lambda: k.adjoint(x, np.zeros(6), *bufs), [x, *bufs])
    _refused(TypeError, r"^power.jvp: argument 'a' \(default 0.5\) got an array",
             lambda: k.jvp(x, np.zeros(6), np.ones(6), np.zeros(6)), [x])


def test_defaults_left_out_before_positional_tangents(data):
    """k.jvp: the tangents move into an omitted default's place; refused, naming it,
    as k.adjoint does.  With the default passed, the tangent matches finite differences."""
    k = kadj.differentiate(scaled_product)
    x, y, ct = data
    out = np.zeros(6)
    tans = [np.ones(6), np.zeros(6), np.zeros(6)]
    msg = _refused(TypeError, r"^scaled_product.jvp: argument 'scale' \(default None\) "
                   "got an array, probably a tangent",
                   lambda: k.jvp(x, y, out, *tans), [x, y, *tans])
    assert "jvp takes every forward argument" in msg and "dot_<name>=" in msg
    k2 = kadj.differentiate(square_with_option)
    msg = _refused(TypeError, r"argument 'w' \(default None\) got an array, probably a "
                   r"tangent \(square_with_option.jvp is missing tangent argument",
                   lambda: k2.jvp(x, out, np.ones(6), np.zeros(6), np.zeros(6)),
                   [x])
    k3 = kadj.differentiate(axpy)
    msg = _refused(TypeError, r"^axpy.jvp: argument 'a' \(default 0.5\) got an array",
                   lambda: k3.jvp(x, y.copy(), np.ones(6), np.zeros(6)), [x])
    # the default passed: the tangent of out along dx, against central differences
    dx, dy, dout = ct.copy(), np.zeros(6), np.zeros(6)
    k.jvp(x, y, out, None, dx, dy, dout)
    plus, minus, eps = np.zeros(6), np.zeros(6), 1e-6
    scaled_product.py_func(x + eps * dx, y, plus)
    scaled_product.py_func(x - eps * dx, y, minus)
    np.testing.assert_allclose(dout, (plus - minus) / (2 * eps), rtol=1e-7, atol=1e-9)


# ---- 5. kadj.grad with default arguments -------------------------------------------------
@njit
def weighted_energy(x, scale=2.0):
    s = 0.0
    for i in range(x.shape[0]):
        s += scale * math.sin(x[i]) * x[i]
    return s


@njit
def head_energy(x, n=3):
    s = 0.0
    for i in range(n):
        s += x[i] * x[i] * x[i]
    return s


def _fd_grad(f, x, *rest, eps=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e, *rest) - f(x - e, *rest)) / (2 * eps)
    return g


def test_grad_fills_float_default():
    x = np.linspace(-1.0, 1.2, 5)
    f = weighted_energy.py_func
    np.testing.assert_allclose(kadj.grad(weighted_energy)(x), _fd_grad(f, x), rtol=1e-7)
    np.testing.assert_allclose(kadj.grad(weighted_energy)(x, scale=3.0),
                               _fd_grad(f, x, 3.0), rtol=1e-7)
    v, (gx, gs) = kadj.value_and_grad(weighted_energy, argnums=(0, 1))(x)
    assert v == pytest.approx(f(x))
    eps = 1e-6
    assert gs == pytest.approx((f(x, 2.0 + eps) - f(x, 2.0 - eps)) / (2 * eps), rel=1e-7)
    np.testing.assert_allclose(gx, _fd_grad(f, x), rtol=1e-7)


def test_grad_fills_integer_default():
    x = np.linspace(0.5, 1.5, 5)
    g = kadj.grad(head_energy)(x)
    np.testing.assert_allclose(g, _fd_grad(head_energy.py_func, x), rtol=1e-7, atol=1e-9)
    assert np.all(g[3:] == 0.0) and np.all(g[:3] != 0.0)


# ---- 6. register_adjoint rules -----------------------------------------------------------
@njit
def _cube(v):
    return v * v * v


@njit
def _scaled_sum(a, b):
    return a + 2.0 * b


@njit
def _soft(v, c=1.0):
    return math.log(1.0 + math.exp(c * v))


@njit
def cube_layer(x, y):
    for i in range(x.shape[0]):
        y[i] = _cube(x[i]) + x[i]


@njit
def pair_layer(x, w, y):
    for i in range(x.shape[0]):
        y[i] = _scaled_sum(x[i], w[i])


def test_rule_with_wrong_arity_is_refused_at_registration():
    try:
        with pytest.raises(kadj.DifferentiationError) as info:
            @kadj.register_adjoint(_cube)
            def _too_few(g, out):
                return (g,)
        msg = str(info.value)
        assert "_too_few" in msg and "_cube(v)" in msg and "What you can do" in msg, msg
        # a function with a default argument: the rule must take both arities
        with pytest.raises(kadj.DifferentiationError, match="with 2 argument"):
            @kadj.register_adjoint(_soft)
            def _one_only(g, out, v):
                return (g,)
        assert rules.lookup(_cube) is None and rules.lookup(_soft) is None

        @kadj.register_adjoint(_soft)          # accepted: takes (v) and (v, c)
        def _both(g, out, v, c=None):
            return (g,) if c is None else (g, None)
    finally:
        rules.unregister(_cube)
        rules.unregister(_soft)


def test_rule_returning_too_few_contributions_is_refused():
    x, w = np.linspace(0.1, 0.9, 4), np.linspace(1.0, 2.0, 4)
    try:
        @kadj.register_adjoint(_scaled_sum)
        def _forgets_b(g, out, a, b):
            return (g,)                           # the contribution to b is missing
        k2 = kadj.differentiate(pair_layer)
        bufs = [np.zeros(4), np.zeros(4), np.ones(4)]
        msg = _refused(kadj.DifferentiationError, "returned 1 contribution",
                       lambda: k2.adjoint(x, w, np.zeros(4), *bufs), [x, w, *bufs])
        assert "_forgets_b" in msg and "_scaled_sum" in msg and "What you can do" in msg
    finally:
        rules.unregister(_scaled_sum)


def test_replaced_rule_rebuilds_existing_adjoints():
    x = np.linspace(-1.0, 1.0, 5)
    ct = np.linspace(0.5, 1.5, 5)
    kc = kadj.differentiate(cube_layer)
    try:
        @kadj.register_adjoint(_cube)
        def _wrong(g, out, v):
            return (g * v,)                       # deliberately wrong: d v^3/dv is 3 v^2

        adj_x = np.zeros(5)
        kc.adjoint(x, np.zeros(5), adj_x, ct.copy())
        np.testing.assert_allclose(adj_x, ct * (x + 1.0), rtol=1e-14)   # the wrong rule

        @kadj.register_adjoint(_cube)
        def _right(g, out, v):
            return (3.0 * g * v * v,)

        adj_x = np.zeros(5)
        kc.adjoint(x, np.zeros(5), adj_x, ct.copy())
        eps = 1e-6
        fd = np.array([((x[i] + eps) ** 3 - (x[i] - eps) ** 3) / (2 * eps) + 1.0
                       for i in range(5)]) * ct
        np.testing.assert_allclose(adj_x, fd, rtol=1e-8)
    finally:
        rules.unregister(_cube)


# ---- the same checks on CUDA, in the simulator -------------------------------------------
SIM_CASES = ["launch_configuration", "stride0_buffers", "overlaps_numpy",
             "overlaps_device", "bad_arguments", "keywords", "none_default"]


@pytest.fixture(scope="module")
def sim_results():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *SIM_CASES],
                          env=env, capture_output=True, text=True, timeout=600)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = (line + " ").split(" ", 3)
            out[name] = (status, rest)
    if not out:
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out


@pytest.mark.parametrize("name", SIM_CASES)
def test_cuda_simulator(sim_results, name):
    assert name in sim_results, f"case {name} did not report"
    status, detail = sim_results[name]
    assert status == "OK", detail


def _sim_cases():
    """The simulator cases: name -> function raising AssertionError on failure (the
    kernels ``heat`` and ``scaled_square`` and ``cuda`` are module globals, defined when
    run as a script)."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    hk = kadj.differentiate(heat)
    rng = np.random.default_rng(3)
    u, ct = rng.standard_normal(12), rng.standard_normal(12)

    def host(a):
        return a.copy_to_host() if hasattr(a, "copy_to_host") else a

    def refused(exc, match, fn, arrays):
        before = [host(a).copy() for a in arrays]
        try:
            fn()
        except exc as e:
            import re
            assert re.search(match, str(e)), f"{match!r} not in: {e}"
        else:
            raise AssertionError(f"accepted, expected {exc.__name__} matching {match!r}")
        for a, b in zip(arrays, before):
            assert np.array_equal(host(a), b), "a refused call modified an array"

    def reference(u, alpha, ct):
        """Analytic adjoint of heat: adj_u, adj_un (before the call), adj_alpha."""
        au, aun, aa = np.zeros_like(u), ct.copy(), 0.0
        for i in range(1, u.size - 1):
            au[i - 1] += alpha * ct[i]
            au[i] += (1.0 - 2.0 * alpha) * ct[i]
            au[i + 1] += alpha * ct[i]
            aa += ct[i] * (u[i - 1] - 2.0 * u[i] + u[i + 1])
            aun[i] = 0.0
        return au, aun, aa

    def launch_configuration():
        un = np.zeros(12)
        bufs = [np.zeros(12), ct.copy(), np.zeros(1)]
        for config, exc, match in [((0, 8), ValueError, "grid dimension x is 0"),
                                   ((2, -4), ValueError, "block dimension x is -4"),
                                   ((2.0, 8), TypeError, "integers"),
                                   ((1, 2048), ValueError, "at most 1024"),
                                   ((1, (32, 64)), ValueError, "2048 threads")]:
            refused(exc, "heat\\[.*" + match, lambda: hk[config](u, un, 0.1), [u, un])
            refused(exc, "heat.adjoint\\[.*" + match,
                    lambda: hk.adjoint[config](u, un, 0.1, *bufs), [u, un, *bufs])
        refused(TypeError, "needs a launch configuration", lambda: hk.adjoint[8], [u])

    def stride0_buffers():
        un = np.zeros(12)
        stuck = as_strided(np.zeros(1), (12,), (0,))
        dev_stuck = FakeCUDAArray(as_strided(np.zeros(1), (12,), (0,)))
        for bad in (stuck, dev_stuck):
            bufs = [bad, ct.copy(), np.zeros(1)]
            refused(ValueError, "several elements of adj_u share memory",
                    lambda: hk.adjoint[2, 8](u, un, 0.1, *bufs), [u, un, *bufs[1:]])

    def overlaps_numpy():
        big = np.zeros(24)
        big[:12] = u
        bufs = [big[6:18], ct.copy(), np.zeros(1)]
        refused(ValueError, "adj_u shares memory with the forward argument 'u'",
                lambda: hk.adjoint[2, 8](big[:12], np.zeros(12), 0.1, *bufs), [big, *bufs])
        store = np.zeros(24)
        bufs = [store[:12], store[10:22], np.zeros(1)]
        refused(ValueError, "adj_u and adj_un share memory",
                lambda: hk.adjoint[2, 8](u, np.zeros(12), 0.1, *bufs), [u, store])
        refused(ValueError, "'u' overlaps 'un'",
                lambda: hk.adjoint[2, 8](big[:12], big[6:18], 0.1, *_bufs(12)), [big])

    def overlaps_device():
        big = cuda.to_device(np.concatenate([u, np.zeros(12)]))
        du, dun = cuda.to_device(u), cuda.to_device(np.zeros(12))
        dct = cuda.to_device(ct)
        bufs = [big[6:18], dct, cuda.to_device(np.zeros(1))]
        refused(ValueError, "adj_u shares memory with the forward argument 'u'",
                lambda: hk.adjoint[2, 8](big[:12], dun, 0.1, *bufs), [big, dun, *bufs[1:]])
        store = cuda.to_device(np.zeros(24))
        bufs = [store[:12], store[11:23], cuda.to_device(np.zeros(1))]
        refused(ValueError, "adj_u and adj_un share memory",
                lambda: hk.adjoint[2, 8](du, dun, 0.1, *bufs), [du, dun, store])
        refused(ValueError, "'u' overlaps 'un'",
                lambda: hk.adjoint[2, 8](big[:12], big[6:18], 0.1,
                                         *[cuda.to_device(b) for b in _bufs(12)]), [big])
        # interleaved device views share no element: accepted, and exact
        both = np.zeros(24)
        both[1::2] = ct
        au = cuda.to_device(both)
        adj = [au[0::2], au[1::2], cuda.to_device(np.zeros(1))]
        hk.adjoint[2, 8](du, dun, 0.1, *adj)
        ru, run, ra = reference(u, 0.1, ct)
        got = au.copy_to_host()
        assert np.allclose(got[0::2], ru, rtol=1e-13, atol=1e-15), (got[0::2], ru)
        assert np.allclose(got[1::2], run, rtol=1e-13, atol=1e-15)
        assert np.isclose(adj[2].copy_to_host()[0], ra, rtol=1e-12)

    def bad_arguments():
        un = np.zeros(12)
        fresh = _no_build(kadj.differentiate(heat))
        for args, match in [((u.astype(np.float16), un, 0.1), "'u' is a float16 array"),
                            ((u.astype(">f8"), un, 0.1), "'u' has non-native byte order"),
                            ((list(u), un, 0.1), "'u' is a Python list")]:
            bufs = _bufs(12)
            refused(TypeError, "^heat: argument " + match,
                    lambda: fresh.adjoint[2, 8](*args, *bufs), [u, un, *bufs])
        bufs = _bufs(12)
        refused(TypeError, "heat: argument 'u' is None",
                lambda: hk.adjoint[2, 8](None, un, 0.1, *bufs), [un, *bufs])

    def keywords():
        un, want = np.zeros(12), np.zeros(12)
        hk[2, 8](u, un=un, alpha=0.1)
        heat[2, 8](u, want, 0.1)
        assert np.array_equal(un, want), "keyword forward launch differs"
        adj_u, adj_un, adj_a = np.zeros(12), ct.copy(), np.zeros(1)
        hk.adjoint[2, 8](u, un, alpha=0.1, adj_alpha=adj_a, adj_un=adj_un, adj_u=adj_u)
        ru, run, ra = reference(u, 0.1, ct)
        assert np.allclose(adj_u, ru, rtol=1e-13, atol=1e-15), (adj_u, ru)
        assert np.allclose(adj_un, run, rtol=1e-13, atol=1e-15)
        assert np.isclose(adj_a[0], ra, rtol=1e-12)
        refused(TypeError, "unexpected keyword argument 'beta'",
                lambda: hk[2, 8](u, un, beta=0.1), [u, un])

    def none_default():
        sk = kadj.differentiate(scaled_square)
        out = np.zeros(12)
        sk[2, 8](u, out)                           # the default filled in
        assert np.allclose(out, 2.0 * u * u, rtol=1e-15)
        for call in (lambda au, aout: sk.adjoint[2, 8](u, out, None, au, aout),
                     lambda au, aout: sk.adjoint[2, 8](u, out, adj_u=au, adj_out=aout)):
            au, aout = np.zeros(12), ct.copy()
            call(au, aout)
            assert np.allclose(au, 4.0 * u * ct, rtol=1e-14), (au, 4.0 * u * ct)
        bufs = [np.zeros(12), ct.copy()]
        refused(TypeError, r"^scaled_square.adjoint: argument 'scale' \(default None\) got "
                "an array, probably an adjoint",
                lambda: sk.adjoint[2, 8](u, out, *bufs), [u, out, *bufs])

    return {name: fn for name, fn in locals().items() if name in SIM_CASES}


def _sim_main(names):
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    cases = _sim_cases()
    for name in names or SIM_CASES:
        try:
            cases[name]()
            print(f"CASE {name} OK", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    from numba import cuda   # the simulator: NUMBA_ENABLE_CUDASIM=1 was set before

    @cuda.jit
    def heat(u, un, alpha):
        i = cuda.grid(1)
        if 0 < i < u.shape[0] - 1:
            un[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])

    @cuda.jit
    def scaled_square(u, out, scale=None):
        i = cuda.grid(1)
        if i < u.shape[0]:
            s = 2.0 if scale is None else scale
            out[i] = s * u[i] * u[i]

    _sim_main(sys.argv[1:])
