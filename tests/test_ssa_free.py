"""Serial CPU adjoints compile without numba's SSA reconstruction only where that cannot
change what they compute (kadj.ssa_free)."""
import numba
import numpy as np
import pytest

import kadj
from kadj import ssa_free
from kadj.ssa_free import AdjointCompiler

from kernels.cpu import by_name

from fdcheck import fd_check


@pytest.fixture(autouse=True)
def _compiled_here(monkeypatch):
    """Adjoints compiled in this process (a cached one does not say how it compiled)."""
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")


def _pipeline(dispatcher):
    """The name of the numba pipeline that compiled the dispatcher's one overload."""
    (cres,) = dispatcher.overloads.values()
    (name,) = cres.metadata["pipeline_times"]
    return name


def _changes_type(n):
    t = 1 << 60             # an integer here ...
    a = 0
    if n > 0:
        a = (t + 1) - t     # ... exact as an integer (1), 0.0 as a float
        t = n * 1.5         # ... and a float here, in another block
    return a * t


def _one_type(n):
    s = 0.0
    for i in range(n):
        s = s + i * 0.5
    return s


def _untypable_without_ssa(n):
    t = (1, 2)              # a tuple here, a float later (another block): no one type
    m = t[0] + t[1]
    if n > 0:
        t = n * 0.5
        return t * m
    return 0.0


def test_a_variable_that_changes_type_takes_the_ssa_pipeline():
    f = numba.njit(pipeline_class=AdjointCompiler)(_changes_type)
    assert f(2) == 3.0          # a == 1 (an int); a float t would give 0.0
    assert _pipeline(f) == "nopython"


def test_one_type_per_variable_compiles_without_ssa():
    f = numba.njit(pipeline_class=AdjointCompiler)(_one_type)
    assert f(10) == _one_type(10)
    assert _pipeline(f) == "kadj_ssa_free"


def _narrow_copied_wide(x):
    # c is float32, assigned once; copied into s, which the loop makes float64.
    # Without SSA numba unified c with s (float64), and c * c was a float64 product
    c = x[0]
    s = c
    for k in range(3):
        s = s * 0.5 + c * c
    return s


def test_a_variable_assigned_once_keeps_its_own_type():
    x = np.array([0.1234567], np.float32)
    f = numba.njit(pipeline_class=AdjointCompiler)(_narrow_copied_wide)
    assert f(x) == numba.njit(_narrow_copied_wide)(x)
    assert _pipeline(f) == "nopython"


def _ternary_mixed(n):
    # the arms (an int, a float) meet in numba's join temporary ($phi...): with SSA a
    # phi of the unified type (float64), without SSA that one type; 2**60 + 1 becomes
    # 2.0**60 either way, so the result is 0.0 in both
    a = (1 << 60) + 1 if n > 0 else 0.5
    return a - (1 << 60)


def test_a_ternary_of_two_types_compiles_without_ssa_and_computes_the_same():
    f = numba.njit(pipeline_class=AdjointCompiler)(_ternary_mixed)
    g = numba.njit(_ternary_mixed)
    for n in (1, 0):
        assert f(n) == g(n)
    assert f(1) == 0.0 and f(0) == 0.5 - 2.0 ** 60
    assert _pipeline(f) == "kadj_ssa_free"


def test_a_typing_failure_without_ssa_falls_back():
    f = numba.njit(pipeline_class=AdjointCompiler)(_untypable_without_ssa)
    assert f(4) == 6.0
    assert _pipeline(f) == "nopython"


def test_options_for_leaves_parallel_adjoints_and_the_switch_alone(monkeypatch):
    assert ssa_free.options_for({"fastmath": True}) == {
        "fastmath": True, "pipeline_class": AdjointCompiler}
    assert ssa_free.options_for({"parallel": True}) == {"parallel": True}
    monkeypatch.setenv("KADJ_SSA_FREE", "0")
    assert ssa_free.options_for({"fastmath": True}) == {"fastmath": True}


@numba.njit
def _kernel_changes_type(x, y):
    for i in range(x.shape[0]):
        t = 1 << 60
        a = (t + 1) - t     # 1 (int): the gradient of y[i] is 1.5, not 0
        t = x[i] * 1.5
        y[i] = a * t


@numba.njit
def _heat(u, v, alpha):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@numba.njit
def _kernel_web_changes_type(x, y):
    for i in range(x.shape[0]):
        t = 1 << 60
        if x[i] > 10.0:          # never taken here; t is float64 in every version
            t = x[i]
        a = (t + 1) - t          # 0.0 (float), in the forward as in the adjoint
        y[i] = a * x[i] + 2.0 * x[i]


def test_kernel_variable_changing_type_gets_the_right_gradient():
    # ``t`` holds an int, then an unrelated float: two webs, two variables of the
    # adjoint (kadj.var_webs), each of one type, so no SSA is needed
    k = kadj.differentiate(_kernel_changes_type)
    x = np.linspace(0.5, 2.0, 9)
    comp = k.compiled(x, np.zeros_like(x))
    gx = np.zeros_like(x)
    k.adjoint(x, np.zeros_like(x), gx, np.ones_like(x))
    np.testing.assert_array_equal(gx, np.full_like(x, 1.5))
    assert _pipeline(comp.function) == "kadj_ssa_free"


def test_one_variable_assigned_two_types_compiles_with_ssa():
    # one web holding an int and a float: the adjoint assigns both, so it takes
    # numba's own pipeline, and computes what the forward computes (a float ``t``)
    k = kadj.differentiate(_kernel_web_changes_type)
    x = np.linspace(0.5, 2.0, 9)
    y = np.zeros_like(x)
    _kernel_web_changes_type(x, y)
    np.testing.assert_array_equal(y, 2.0 * x)
    comp = k.compiled(x, np.zeros_like(x))
    gx = np.zeros_like(x)
    k.adjoint(x, np.zeros_like(x), gx, np.ones_like(x))
    np.testing.assert_array_equal(gx, np.full_like(x, 2.0))
    assert _pipeline(comp.function) == "nopython"


def test_serial_adjoint_without_ssa_equals_the_ssa_compiled_one():
    """The same adjoint source compiled both ways gives bit-identical buffers, and the
    gradient matches finite differences."""
    k = kadj.differentiate(_heat)
    rng = np.random.default_rng(3)
    u = rng.standard_normal(200)
    comp = k.compiled(u, np.zeros_like(u), 0.1)
    k.adjoint(u, np.zeros_like(u), 0.1, np.zeros_like(u), rng.standard_normal(200),
              np.zeros(1))
    assert _pipeline(comp.function) == "kadj_ssa_free"
    # numba's pipeline with SSA, and the same LLVM optimisation (kadj.lean_library:
    # LLVM may add a sum it is allowed to reassociate in another order under another
    # pass order; tests/test_lean_library.py compares that with numba's own)
    ssa = numba.njit(error_model="numpy", pipeline_class=ssa_free.WithSSA)(
        comp.function.py_func)
    outs = []
    for fn in (comp.function, ssa):
        bufs = (np.zeros_like(u), np.linspace(-1.0, 1.0, 200), np.zeros(1))
        fn(u, np.zeros_like(u), 0.1, *bufs, *comp.fresh_memory())
        outs.append(bufs)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
    assert np.any(outs[0][0] != 0.0) and outs[0][2][0] != 0.0
    fd_check(k, (u[:12].copy(), np.zeros(12), 0.1))


@pytest.mark.parametrize("name", ["horner", "rk4_pendulum", "thomas_batched", "softmax_f32",
                                  "inplace_update_f32"])
def test_gallery_adjoints_compile_without_ssa(name):
    """Gallery kernels with replayed loops, helpers and row sweeps type one type per
    variable (float32 ones: but for numba's join temporaries of a ternary whose arms
    are float32 and float64): they take the SSA-free pipeline (the gradient itself is
    checked by the gallery tests, and the slow suite compares every gallery adjoint
    with its SSA compilation)."""
    ex = by_name(name)
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = ex.make_args(np.random.default_rng(0))
    comp = k.compiled(*args)
    plan = k.adjoint_plan(*args)
    k.adjoint(*args, *(np.zeros_like(args[i]) if isinstance(args[i], np.ndarray)
                       else np.zeros(1, np.asarray(args[i]).dtype)
                       for i in plan.adjoint_args))
    assert _pipeline(comp.function) == "kadj_ssa_free"


def _gallery():
    from kernels.cpu import GALLERY
    return GALLERY


@pytest.mark.slow
@pytest.mark.parametrize("ex", _gallery(), ids=[ex.name for ex in _gallery()])
def test_gallery_adjoint_bit_identical_with_ssa(ex):
    """Every CPU gallery adjoint: the buffers and return value of its compiled adjoint
    equal, bit for bit, those of the same source compiled by numba's own pipeline
    (with the adjoints' LLVM optimisation, ``ssa_free.WithSSA``)."""
    from kadj.tape_measure import adjoint_buffers
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = tuple(ex.make_args(np.random.default_rng(1)))
    comp = k.compiled(*args)
    plan = comp.plan
    if comp.function.targetoptions.get("parallel"):
        pytest.skip("a parallel adjoint always compiles with numba's own pipeline")
    ssa = numba.njit(**{o: v for o, v in comp.function.targetoptions.items()
                        if o not in ("pipeline_class", "nopython")},
                     pipeline_class=ssa_free.WithSSA)(comp.function.py_func)
    results = []
    for fn in (comp.function, ssa):
        fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        bufs = adjoint_buffers(plan, fwd, fill=0.5)
        extra = (0.7,) if plan.returns_value else ()
        ret = fn(*fwd, *bufs, *extra, *comp.fresh_memory())
        results.append((fwd, bufs, ret))
    (fwd_a, bufs_a, ret_a), (fwd_b, bufs_b, ret_b) = results
    for a, b in zip(fwd_a + bufs_a, fwd_b + bufs_b):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=ex.name)
    assert repr(ret_a) == repr(ret_b)


@numba.njit
def _scale_row(a, v):
    for j in range(a.shape[0]):
        a[j] = a[j] * v


@numba.njit
def rows_scaled_through_a_helper(y, M):
    for i in range(M.shape[0]):
        _scale_row(M[i], y[i])


@numba.njit
def rows_scaled_through_a_view(y, M):
    for i in range(M.shape[0]):
        a = M[i]
        for j in range(a.shape[0]):
            a[j] = a[j] * y[i]


@pytest.mark.parametrize("fn", [rows_scaled_through_a_helper, rows_scaled_through_a_view])
def test_an_expression_without_an_operand_is_checked_not_crashed_on(fn):
    # the check after typing asked every value for its operand: numba's ir.Expr
    # raises KeyError, not AttributeError, for one it does not have (a regression:
    # KeyError: 'value' instead of an adjoint)
    k = kadj.differentiate(fn)
    for n in (1, 2, 5):
        rng = np.random.default_rng(n)
        fd_check(k, (rng.uniform(-1, 1, n), rng.uniform(-1, 1, (n, 3))))
