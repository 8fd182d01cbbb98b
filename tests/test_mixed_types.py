"""A variable name that holds values of different types: an integer and a float (a loop
index reused for a float, ``k = i`` then ``k = 0.5 * x[i]``), a number and an array.

numba compiles such kernels (it types them with SSA: one version per assignment).
kadj's frontend types without SSA, one type per name, and a copy ``k = i`` sends the
type of ``k`` back to ``i``; where that fails, it types the kernel again with SSA
(:func:`kadj.frontend._typed`).  Gradients are checked against finite differences
(``check_grad``, bounds-checked) at small sizes and at sizes whose tapes outgrow their
first capacity.  The SSA form is checked on its own too, over a sample of the gallery
(every kernel with ``-m slow``), and where it refuses a loop, the refusal says why the
kernel was typed so and what to do.
"""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import frontend
from kadj.testing import check_grad

pytestmark = pytest.mark.usefixtures("private_cache_dir")


@njit
def int_or_float_in_branch(x, out):
    for i in range(x.shape[0]):
        k = i
        if x[i] > 0.5:
            k = x[i] * 2.0
        out[i] = k * x[i]


@njit
def index_reused_after_inner_loop(W, x, y):
    loss = 0.0
    for t in range(y.shape[0]):
        a = 0.0
        for d in range(x.shape[0]):
            a += W[d] * x[d]
        d = a - y[t]             # the inner loop's index, now a float
        loss += d * d
    return loss


@njit
def float_then_loop_index(x, out):
    for t in range(out.shape[0]):
        r = x[t] * 2.0
        out[t] = r
        for r in range(2):       # the float's name, now an index
            out[t] += x[r] * x[t]


@njit
def index_reassigned_as_float(x, out):
    for i in range(x.shape[0]):
        j = i
        i = x[j] * 3.0
        out[j] = i * math.sin(i)


@njit
def number_then_array(x, out):
    for t in range(out.shape[0]):
        v = x[t] * 2.0
        out[t] = v * v
        v = x[t:t + 2]           # the number's name, now a view
        out[t] += v[1] * v[0]


@njit
def recorded_across_types(x, y):
    # a value the reverse needs is overwritten in every iteration (taped), and the
    # name that held an int holds a float on one path
    s = 0.5
    for i in range(x.shape[0]):
        k = i
        if x[i] > 0.5:
            k = math.sin(s) * x[i]
        s = 0.9 * s + 0.1 * math.cos(k * s / (i + 1))
    y[0] = s


def _x(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.05, 0.95, n)
    x[np.abs(x - 0.5) < 0.05] += 0.1     # away from the branch's tie
    return x


CASES = {
    "int_or_float_in_branch": lambda n: (_x(n), np.zeros(n)),
    "index_reused_after_inner_loop": lambda n: (_x(4), _x(4, 1), _x(n, 2)),
    "float_then_loop_index": lambda n: (_x(max(n, 2)), np.zeros(max(n, 2))),
    "index_reassigned_as_float": lambda n: (_x(n), np.zeros(n)),
    "number_then_array": lambda n: (_x(n + 1), np.zeros(n)),
    "recorded_across_types": lambda n: (_x(n), np.zeros(1)),
}
KERNELS = {f.__name__: f for f in (
    int_or_float_in_branch, index_reused_after_inner_loop, float_then_loop_index,
    index_reassigned_as_float, number_then_array, recorded_across_types)}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("n", [1, 5, 2500])
def test_gradient_of_a_name_with_two_types(name, n):
    k = kadj.differentiate(KERNELS[name])
    check_grad(k, CASES[name](n), full_jacobian_max=0 if n > 100 else 64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_such_kernels_are_typed_with_ssa_and_others_are_not(name):
    k = kadj.differentiate(KERNELS[name])
    typed = k.stages(*CASES[name](5), until="typed")["typed"]
    assert typed.retyped.startswith("test_mixed_types.py:"), typed.retyped


def test_a_kernel_with_one_type_per_name_is_typed_without_ssa():
    @njit
    def plain(x, out):
        for i in range(x.shape[0]):
            k = x[i] * 2.0
            out[i] = k
    typed = kadj.differentiate(plain).stages(_x(5), np.zeros(5), until="typed")["typed"]
    assert typed.retyped == ""


def test_a_real_type_error_is_numbas_own():
    from numba.core.errors import TypingError

    @njit
    def wrong(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] + "a"
    with pytest.raises(TypingError, match="add"):
        kadj.differentiate(wrong).adjoint_source(_x(5), np.zeros(5))


@njit
def break_with_two_types(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        m = i
        if x[i] > 0.5:
            m = x[i] * 2.0
        s += m * x[i]
        if s > 3.0:
            break
    y[0] = s


def test_a_refusal_after_ssa_typing_says_why_and_what_to_do():
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(break_with_two_types).adjoint_source(_x(6), np.zeros(1))
    text = str(info.value)
    assert "one type per variable name" in text, text
    assert "test_mixed_types.py:" in text and "a name of its own" in text, text


def test_renamed_as_the_refusal_says_it_differentiates():
    @njit
    def renamed(x, y):
        s = 0.0
        for i in range(x.shape[0]):
            m = float(i)
            if x[i] > 0.5:
                m = x[i] * 2.0
            s += m * x[i]
            if s > 3.0:
                break
        y[0] = s
    k = kadj.differentiate(renamed)
    assert k.stages(_x(6), np.zeros(1), until="typed")["typed"].retyped == ""
    check_grad(k, (_x(6), np.zeros(1)))


# ---- the SSA form on its own, over the gallery ------------------------------------

def _gallery(every):
    from kernels.cpu import GALLERY
    return [pytest.param(ex, id=ex.name, marks=() if i % every == 0 else pytest.mark.slow)
            for i, ex in enumerate(GALLERY)]


@pytest.fixture
def always_ssa(monkeypatch):
    """kadj's frontend types every kernel with SSA (no disk cache: its key does not
    tell the two forms apart)."""
    plain = frontend._flags

    def with_ssa():
        flags = plain()
        flags.enable_ssa = True
        return flags
    monkeypatch.setattr(frontend, "_flags", with_ssa)
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")


@pytest.mark.parametrize("ex", _gallery(every=8))
def test_gallery_typed_with_ssa(always_ssa, ex):
    """Typed with SSA, each gallery kernel differentiates to the right gradient or is
    refused with a DifferentiationError (loops left by ``break``), never wrong."""
    args = tuple(ex.make_args(np.random.default_rng(0)))
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    try:
        k.adjoint_source(*args)
    except kadj.DifferentiationError as exc:
        assert "break" in str(exc) or "not supported" in str(exc), str(exc)
        return
    tol = dict(rtol=2e-2, atol=2e-3) if "float32" in ex.tags else \
        dict(rtol=1e-5, atol=1e-6)
    check_grad(k, args, wrt=ex.wrt, **tol)


# ---- CUDA ------------------------------------------------------------------------

def test_cuda_simulator_gradient():
    from cudatools import run_sim_cases
    status, detail = run_sim_cases("mixed_types_cuda_sim.py", ["int_or_float"])[
        "int_or_float"]
    assert status == "OK", detail


def test_cuda_adjoint_compiles_to_ptx():
    from cudatools import nvvm_available
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    from numba import cuda

    @cuda.jit
    def int_or_float(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            k = i
            if x[i] > 0.5:
                k = x[i] * 2.0
            out[i] = k * x[i]
    k = kadj.differentiate(int_or_float)
    assert k.stages(_x(8), np.zeros(8), until="typed")["typed"].retyped
    assert ".entry" in k.adjoint_ptx(_x(8), np.zeros(8), cc=(9, 0))
