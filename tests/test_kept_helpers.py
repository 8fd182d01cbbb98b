"""The kept-memory allocation builtins (kadj/kept_helpers.py) in compiled code and as
Python: the same arrays as NumPy's allocations, a view of the kept bytes exactly when
they are enough, the bytes asked for noted otherwise, NumPy's errors, and no helper
function linked into an adjoint."""
import gc

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.kept_helpers import (_kept_array, _kept_copy, _kept_like, _kept_zeros,
                               _kept_zeros_like)


@njit
def _c_array(keep, n, need):
    return _kept_array(keep, n, np.float64, need, 1)


@njit
def _c_array_2d(keep, shape, need):
    return _kept_array(keep, shape, np.int64, need, 2)


@njit
def _c_zeros(keep, shape, need):
    return _kept_zeros(keep, shape, np.complex128, need, 1)


@njit
def _c_copy(keep, x, need):
    return _kept_copy(keep, x, need, 1)


@njit
def _c_like(keep, x, need):
    return _kept_like(keep, x, need, 2)


@njit
def _c_zeros_like(keep, x, need):
    return _kept_zeros_like(keep, x, need, 1)


@njit
def _c_dtype_of(keep, x, need):
    return _kept_array(keep, (x.shape[0], 2), x.dtype, need, 1)


@njit
def _c_scalar_shape(keep, need):
    return _kept_array(keep, (), np.float32, need, 1)


def _need(keep=None, nslots=2):
    """The layout (kadj.call_memory.layout) of ``nslots`` slots, each given the whole of
    ``keep`` as its region (None: no region)."""
    need = np.zeros(3 * nslots + 1, np.int64)
    if keep is not None:
        need[2 * nslots + 1:] = keep.shape[0]
    return need


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_array_fits_is_a_view_of_the_kept_bytes(compiled):
    f = _c_array if compiled else _c_array.py_func
    keep = np.empty(100, np.uint8)
    need = _need(keep)
    a = f(keep, 12, need)
    assert a.shape == (12,) and a.dtype == np.float64 and a.flags.c_contiguous
    assert np.shares_memory(a, keep) and list(need[:3]) == [0, 0, 0]
    a[:] = np.arange(12.0)
    np.testing.assert_array_equal(keep[:96].view(np.float64), np.arange(12.0))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_array_too_big_is_new_memory_and_notes_the_bytes(compiled):
    f = _c_array if compiled else _c_array.py_func
    keep = np.empty(95, np.uint8)
    need = _need(keep)
    a = f(keep, 12, need)
    assert a.shape == (12,) and not np.shares_memory(a, keep)
    assert list(need[:3]) == [1, 96, 0]
    need[1] = 1000                   # a larger earlier request stays
    f(keep, 13, need)
    assert list(need[:3]) == [1, 1000, 0]
    g = _c_array_2d if compiled else _c_array_2d.py_func
    b = g(keep, (3, 5), need)
    assert b.shape == (3, 5) and b.dtype == np.int64 and list(need[:3]) == [1, 1000, 120]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_zeros_and_likes(compiled):
    pick = (lambda f: f) if compiled else (lambda f: f.py_func)
    keep = np.full(4096, 7, np.uint8)
    z = pick(_c_zeros)(keep, (3, 5), _need(keep))
    assert z.shape == (3, 5) and z.dtype == np.complex128 and not z.any()
    assert np.shares_memory(z, keep)
    x = np.arange(24.0).reshape(2, 3, 4)
    e = pick(_c_like)(keep, x, _need(keep))
    assert e.shape == x.shape and e.dtype == x.dtype and e.flags.c_contiguous
    zl = pick(_c_zeros_like)(np.empty(0, np.uint8), x, _need())
    assert zl.shape == x.shape and not zl.any()
    d = pick(_c_dtype_of)(keep, np.zeros(5, np.float32), _need(keep))
    assert d.shape == (5, 2) and d.dtype == np.float32
    s = pick(_c_scalar_shape)(keep, _need(keep))
    assert s.shape == () and s.dtype == np.float32


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_copy_of_any_layout_is_c_ordered_and_equal(compiled, layout):
    f = _c_copy if compiled else _c_copy.py_func
    base = np.arange(60.0).reshape(6, 10) * 1.5
    x = {"C": base, "F": np.asfortranarray(base), "strided": base[::2, 1::3]}[layout]
    for keep in (np.empty(8 * x.size, np.uint8), np.empty(3, np.uint8)):
        need = _need(keep)
        c = f(keep, x, need)
        np.testing.assert_array_equal(c, x)
        assert c.flags.c_contiguous and not np.shares_memory(c, x)
        assert np.shares_memory(c, keep) == (keep.size >= 8 * x.size)
        assert need[1] == (0 if keep.size >= 8 * x.size else 8 * x.size)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_numpys_errors(compiled):
    f = _c_array if compiled else _c_array.py_func
    keep = np.empty(4096, np.uint8)
    need = _need(keep)
    with pytest.raises(ValueError):
        f(keep, -1, need)
    assert list(need[:3]) == [0, 0, 0]
    with pytest.raises((ValueError, MemoryError)):
        f(keep, 2 ** 62, need)     # 8 * 2**62 bytes overflows


@njit
def _numbas_empty_2d(shape):
    return np.empty(shape, np.int64)


def _outcome(f, *args):
    try:
        return ("ok", f(*args).shape)
    except Exception as exc:   # noqa: BLE001 (the outcome compared, whatever it is)
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("shape", [(3, 5), (0, 7), (2 ** 61, 0), (2 ** 40, 2 ** 22),
                                   (2 ** 31, 2 ** 31), (2 ** 62, 4), (-1, 3), (3, -2),
                                   (2 ** 30, 2 ** 27)])
def test_new_memory_as_numbas_np_empty_allocates(shape):
    """Bytes the kept ones cannot hold: numba's ``np.empty``'s array, or its error
    (too big: its size in elements, then in bytes, overflows; negative; more than
    can be allocated), with its message."""
    keep = np.empty(16, np.uint8)
    need = _need(keep)
    got = _outcome(_c_array_2d, keep, shape, need)
    assert got == _outcome(_numbas_empty_2d, shape), shape
    assert got[0] != "ok" or need[0] == (1 if 8 * shape[0] * shape[1] > 16 else 0)


def test_a_view_keeps_the_kept_bytes_alive():
    keep = np.empty(800, np.uint8)
    a = _c_array(keep, 100, _need(keep))
    a[:] = 3.0
    del keep
    gc.collect()
    np.testing.assert_array_equal(a, 3.0)


@pytest.mark.parametrize("name, calls", [
    ("softmax_f32", ("_kept_copy(", "_kept_array(")),
    ("fixed_point_cos", ("_kept_array(", "_reserve(")),     # a tape that grows
])
def test_adjoints_link_no_helper_function(monkeypatch, name, calls):
    """The allocations and a tape's growth are written in place: the compiled
    adjoint's module defines no function of kadj's (a linked helper is optimised and
    compiled again in each)."""
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")     # compiled here: its IR is kept
    from kernels.cpu import GALLERY
    from kadj.tape_measure import adjoint_buffers
    ex = {e.name: e for e in GALLERY}[name]
    args = ex.make_args(np.random.default_rng(0))
    k = kadj.differentiate(njit(ex.kernel.py_func), wrt=ex.wrt)
    src = k.adjoint_source(*args)
    assert all(c in src for c in calls), src
    k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args],
              *adjoint_buffers(k.adjoint_plan(*args), args, fill=0.0))
    lib = next(iter(k._last.function.overloads.values())).library
    defined = [line for line in lib.get_llvm_str().splitlines() if line.startswith("define")]
    assert any("_adjoint" in line for line in defined)
    assert [line for line in defined if "_ZN4kadj" in line] == []


@njit
def _c_string_dtype(keep, n, need):
    return _kept_array(keep, n, "float32", need, 1), _kept_zeros(keep, (n, 2), "int64",
                                                                  need, 1)


def test_a_dtype_given_as_text_is_numbas_own_allocation():
    keep = np.empty(4096, np.uint8)
    need = _need(keep)
    a, b = _c_string_dtype(keep, 3, need)
    assert a.dtype == np.float32 and a.shape == (3,) and not np.shares_memory(a, keep)
    assert b.dtype == np.int64 and b.shape == (3, 2) and not b.any()
    assert list(need[:3]) == [0, 0, 0]


@njit
def _c_two(keep, need):
    return (_kept_array(keep, 4, np.float64, need, 1),
            _kept_array(keep, (2, 3), np.int32, need, 2))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_each_slot_takes_its_own_region(compiled):
    f = _c_two if compiled else _c_two.py_func
    keep = np.zeros(192, np.uint8)
    need = np.array([0, 0, 0, 0, 64, 32, 24], np.int64)    # offsets 0, 64; sizes 32, 24
    a, b = f(keep, need)
    a[:] = 1.5
    b[:] = 7
    np.testing.assert_array_equal(keep[:32].view(np.float64), 1.5)
    np.testing.assert_array_equal(keep[64:88].view(np.int32), 7)
    assert not keep[32:64].any() and not keep[88:].any()
    assert list(need[:3]) == [0, 0, 0]
    need[6] = 23                     # slot 2's region one byte short
    a, b = f(keep, need)
    assert np.shares_memory(a, keep) and not np.shares_memory(b, keep)
    assert list(need[:3]) == [1, 0, 24]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_layout_outside_the_kept_bytes_is_never_used(compiled):
    """A region beyond the buffer, or a slot the layout does not have: new memory, no
    view out of bounds."""
    f = _c_two if compiled else _c_two.py_func
    keep = np.zeros(64, np.uint8)
    need = np.array([0, 0, 0, 40, 0, 32, 64], np.int64)    # slot 1 at 40..72: outside
    a, b = f(keep, need)
    assert not np.shares_memory(a, keep) and np.shares_memory(b, keep)
    g = _c_array if compiled else _c_array.py_func
    short = np.zeros(1, np.int64)                            # no slots at all
    c = g(keep, 2, short)
    assert not np.shares_memory(c, keep) and list(short) == [0]
