"""Generated adjoints run as printed: the source ``adjoint_source()`` shows begins with
the imports it needs, so executing that text alone, in an empty namespace, defines the
adjoint.  CPU: the function compiled from the shown text gives the same results as the
kernel's own adjoint.  CUDA (every form): it compiles to the same PTX.  An object with
no importable name (a global array) is named by a comment of the header and is the only
thing that must be supplied."""
import re

import numba
import numpy as np
import pytest

import kadj
from kadj.source_header import SUPPLIED_NOTE
from kernels.cpu import GALLERY

CPU_NAMES = ("heat_step", "horner", "rk4_pendulum", "newton_sqrt", "softmax",
             "first_crossing")


def _define(source, namespace=None):
    """The one function the adjoint source defines, executed in ``namespace`` (empty
    unless given)."""
    ns = dict(namespace or {})
    exec(compile(source, "<shown adjoint>", "exec"), ns)
    fns = [v for k, v in ns.items() if callable(v) and k.endswith("_adjoint") or
           k.endswith(("_adjoint_gather", "_adjoint_zero"))]
    assert len(fns) == 1, sorted(ns)
    return fns[0]


def _adjoint_args(fn, args, rng):
    """Forward arguments then a seeded value for every adjoint parameter of ``fn``."""
    import inspect
    out = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    arrays = dict(zip(list(inspect.signature(fn).parameters), args))
    params = [p for p in list(inspect.signature(fn).parameters)[len(args):]
              if not p.startswith("_keep_")]
    for p in params:
        if p == "adj_return":
            out.append(1.25)
        elif p.endswith("_buf"):
            out.append(rng.standard_normal(1))
        else:
            a = arrays[p[len("adj_"):]]
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
    return out + kadj.call_memory.fresh_for(fn)   # every array new memory


def _copies(values):
    return [v.copy() if isinstance(v, np.ndarray) else v for v in values]


@pytest.mark.parametrize("name", CPU_NAMES)
def test_cpu_adjoint_source_runs_as_printed(name):
    ex = next(e for e in GALLERY if e.name == name)
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = tuple(ex.make_args(np.random.default_rng(3)))
    comp = k.compiled(*args)
    assert SUPPLIED_NOTE not in comp.source
    shown = numba.njit(_define(comp.source))
    values = _adjoint_args(shown.py_func, args, np.random.default_rng(4))
    a, b = _copies(values), _copies(values)
    ra, rb = shown(*a), comp.function(*b)
    assert (ra is None) == (rb is None)
    if ra is not None:
        np.testing.assert_allclose(ra, rb, rtol=1e-13, atol=0)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            np.testing.assert_allclose(x, y, rtol=1e-13, atol=0)
    assert any(isinstance(x, np.ndarray) and x.dtype.kind == "f" and np.any(x != v)
               for x, v in zip(a[len(args):], values[len(args):])), \
        "the adjoint changed no adjoint buffer"


WEIGHTS = np.array([0.5, -1.5, 2.0, 0.25])


@kadj.differentiate
@numba.njit
def weighted(x, y):
    for i in range(x.shape[0]):
        y[i] = WEIGHTS[i % 4] * x[i] * x[i]


def test_supplied_objects_are_named_in_the_header():
    x = np.linspace(0.5, 1.5, 6)
    y = np.zeros(6)
    source = weighted.adjoint_source(x, y)
    note = next(line for line in source.splitlines() if line.startswith(SUPPLIED_NOTE))
    supplied = note[len(SUPPLIED_NOTE):].split(", ")
    assert len(supplied) == 1
    with pytest.raises((NameError, numba.core.errors.TypingError),
                       match=f"name '{supplied[0]}' is not defined"):
        numba.njit(_define(source))(x, y, np.zeros(6), np.ones(6))
    adj_x = np.zeros(6)
    numba.njit(_define(source, {supplied[0]: WEIGHTS}))(x, y, adj_x, np.ones(6))
    np.testing.assert_allclose(adj_x, 2.0 * WEIGHTS[np.arange(6) % 4] * x, rtol=1e-14)


# ---- CUDA: every form compiles, as shown, to the adjoint's own PTX ------------------------
CUDA_NAMES = ("heat1d_guarded", "block_sum_squares", "rk4_local_stages", "deposit_cic",
              "math_zoo_f32", "tiled_matmul")


def _ptx_normalised(ptx):
    # the mangled names carry the defining module and shared arrays a process-wide
    # counter; everything else must be identical
    return re.sub(r"_smem_\d+", "_smem", re.sub(r"_ZN\w+", "NAME", ptx))


@pytest.mark.parametrize("name", CUDA_NAMES)
def test_cuda_adjoint_source_runs_as_printed(name):
    cuda = pytest.importorskip("numba.cuda")
    from cudatools import nvvm_available
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    from kernels.cuda import by_name
    case = by_name(name)
    args = case.make_args(np.random.default_rng(0))
    k = case.kernel
    forms = ["scatter"] + (["gather", "zero"] if k.compiled(*args).gather else [])
    for form in forms:
        source = k.adjoint_source(*args, form=form)
        assert SUPPLIED_NOTE not in source
        assert "from numba import cuda" in source
        sig = k.adjoint_signature(*args, form=form)
        # (for_cc: the device functions it calls compile for cc 9.0 without a driver)
        from kadj.cuda.ptx_cc import for_cc
        with for_cc((9, 0)):
            ptx, _ = cuda.compile_ptx(_define(source), sig, cc=(9, 0))
        assert _ptx_normalised(ptx) == _ptx_normalised(k.adjoint_ptx(*args, form=form))
