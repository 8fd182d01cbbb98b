"""kadj.typing_memo: numba's type inference remembers each call's resolution per
function while kadj compiles; the types and results are those numba finds without it,
and numba's compilation outside ``memoised()`` is untouched."""
import math

import numpy as np
from numba import njit
from numba.core import typeinfer

from kadj import typing_memo


def _mixed(x, y, n):
    """Repeated operators on mixed float32/float64/int types, a loop that widens a
    variable, a literal-indexed heterogeneous tuple and methods."""
    t = (1, 2.5, np.float32(0.5))
    s = 0
    acc = np.float32(0.0)
    for i in range(n):
        a = x[i] * t[1] + x[i] * t[2] - t[0]
        b = math.sin(a) * y[i] + math.cos(a) * y[i]
        s = s + b * 2 + i
        acc += np.float32(a) * x[i]
    return s, acc, x.copy().sum() + y.sum()


def _counted(monkeypatch, inside, owner, method):
    """(result, number of numba's own resolutions by ``owner.method``, dispatcher) of a
    fresh compile of ``_mixed``: the memo wraps a counting copy of numba's method."""
    calls = [0]
    current = getattr(owner, method)
    base = getattr(current, "__wrapped__", current)

    def counting(*args):
        calls[0] += 1
        return base(*args)
    monkeypatch.setattr(owner, method, counting)
    monkeypatch.setattr(typing_memo, "_wrapped", set())
    monkeypatch.setattr(typing_memo, "_INFERERS", typing_memo._INFERERS[:1])
    typing_memo._install()
    f = njit(_mixed)
    x = np.linspace(0.1, 1.0, 7).astype(np.float32)
    y = np.linspace(-1.0, 2.0, 7)
    if inside:
        with typing_memo.memoised():
            out = f(x, y, 7)
    else:
        out = f(x, y, 7)
    return out, calls[0], f


def _count_resolutions(monkeypatch, inside):
    return _counted(monkeypatch, inside, typeinfer.TypeInferer, "resolve_call")


def test_same_types_and_results_with_fewer_resolutions(monkeypatch):
    out_plain, n_plain, f_plain = _count_resolutions(monkeypatch, inside=False)
    monkeypatch.undo()
    out_memo, n_memo, f_memo = _count_resolutions(monkeypatch, inside=True)
    monkeypatch.undo()
    assert out_memo == out_plain
    assert f_memo.signatures == f_plain.signatures
    (sig,) = f_plain.signatures
    assert f_memo.overloads[sig].signature == f_plain.overloads[sig].signature
    assert f_memo.overloads[sig].type_annotation.typemap == \
        f_plain.overloads[sig].type_annotation.typemap
    # every repeat answered from the memo: numba's own resolution ran fewer times
    assert 0 < n_memo < n_plain, (n_memo, n_plain)


def test_outside_memoised_numba_resolves_every_time(monkeypatch):
    """The wrapper is inert outside memoised(): no memo on the inferer.  (numba-cuda's
    inferer is wrapped alike: tests/test_cuda_gallery.py compiles every CUDA adjoint
    to PTX inside memoised().)"""
    typing_memo._install()
    seen = []
    original = typeinfer.TypeInferer.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self)
    monkeypatch.setattr(typeinfer.TypeInferer, "__init__", spy)
    f = njit(_mixed)
    f(np.ones(3, np.float32), np.ones(3), 3)
    assert seen and not any("_kadj_resolved" in vars(t) for t in seen)
    g = njit(_mixed)
    with typing_memo.memoised():
        g(np.ones(3, np.float32), np.ones(3), 3)
    assert any(vars(t).get("_kadj_resolved") for t in seen[1:])


def test_a_cpu_adjoint_does_not_import_numba_cuda(tmp_path):
    """The memo wraps numba-cuda's inferer only once numba.cuda is imported: a CPU-only
    first adjoint does not pay numba-cuda's import."""
    import subprocess
    import sys
    script = (
        "import sys, numpy as np, numba, kadj\n"
        "@kadj.differentiate\n@numba.njit\n"
        "def k(x, y):\n"
        "    for i in range(x.shape[0]):\n"
        "        y[i] = x[i] * x[i]\n"
        "gx = np.zeros(4)\n"
        "k.adjoint(np.ones(4), np.zeros(4), gx, np.ones(4))\n"
        "assert (gx == 2.0).all(), gx\n"
        "print('numba.cuda' in sys.modules)\n")
    env = dict(__import__("os").environ, KADJ_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_numba_cuda_inferer_wrapped_once_imported():
    import numba.cuda  # noqa: F401
    with typing_memo.memoised():
        pass
    from numba.cuda.core import typeinfer as cuda_typeinfer
    assert hasattr(cuda_typeinfer.TypeInferer.resolve_call, "__wrapped__")


def _count_call_types(monkeypatch, inside):
    from numba.core.types import functions
    return _counted(monkeypatch, inside, functions.Function, "get_call_type")


def test_function_types_resolved_once_per_block(monkeypatch):
    """Lowering's and typing's repeated resolutions of numba's function types are
    answered from the block's memo: same types, same results, fewer resolutions."""
    out_plain, n_plain, f_plain = _count_call_types(monkeypatch, inside=False)
    monkeypatch.undo()
    out_memo, n_memo, f_memo = _count_call_types(monkeypatch, inside=True)
    monkeypatch.undo()
    assert out_memo == out_plain
    (sig,) = f_plain.signatures
    assert f_memo.signatures == f_plain.signatures
    plain, memo = f_plain.overloads[sig], f_memo.overloads[sig]
    assert memo.signature == plain.signature
    assert memo.type_annotation.typemap == plain.type_annotation.typemap
    assert n_memo < n_plain, (n_memo, n_plain)


def test_function_type_memo_answers_later_blocks_only_inside_them(monkeypatch):
    """A resolution made in one block answers the same question in a later block
    (another kernel's compile); outside every block numba resolves it itself."""
    from numba.core import types
    from numba.core.registry import cpu_target
    typing_memo._install()
    ctx = cpu_target.typing_context
    ctx.refresh()
    fnty = ctx.resolve_value_type(math.hypot)
    args = (types.float32, types.float32)
    calls = [0]
    base = types.Function.get_call_type.__wrapped__

    def counting(self, *a):
        calls[0] += 1
        return base(self, *a)
    monkeypatch.setattr(types.Function, "get_call_type",
                        typing_memo._remembering(counting))
    monkeypatch.setattr(typing_memo, "_calls", {})
    with typing_memo.memoised():
        first = fnty.get_call_type(ctx, args, {})
    assert calls[0] == 1 and first is not None
    with typing_memo.memoised():
        with typing_memo.memoised():
            assert fnty.get_call_type(ctx, args, {}) == first
    assert calls[0] == 1                       # answered from the memo
    assert fnty.get_call_type(ctx, args, {}) == first
    assert calls[0] == 2                       # outside: numba's own resolution
    assert getattr(typing_memo._state, "depth", 0) == 0


def _hyp(x):
    return x


def test_an_overload_added_later_is_seen(monkeypatch):
    """A function that gains an overload after its resolutions were remembered is a new
    function type: the new overload's signature is found, not a remembered failure or
    an older answer."""
    from numba import types
    from numba.extending import overload

    def g(x):
        return _hyp(x) + 1.0

    @overload(_hyp)
    def _hyp_float(x):
        if isinstance(x, types.Float):
            return lambda x: x * 2.0
    with typing_memo.memoised():
        assert njit(g)(1.5) == 4.0
        try:
            njit(g)(np.int64(3))
            raise AssertionError("an int has no overload yet")
        except Exception as exc:            # numba's typing error
            assert "No implementation" in str(exc) or "TypingError" in type(exc).__name__

    @overload(_hyp)
    def _hyp_int(x):
        if isinstance(x, types.Integer):
            return lambda x: x * 3
    with typing_memo.memoised():
        assert njit(g)(np.int64(3)) == 10.0
        assert njit(g)(1.5) == 4.0
