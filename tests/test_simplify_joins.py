"""kadj/simplify_joins.py (branch values and loop counters computed under the kernel's
names) and the conditions kadj/simplify_scopes.py remembers, on hand-built IR run before
and after, and on a generated adjoint whose gradient is checked against finite
differences."""
import copy
import re

import numpy as np
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj.adj_refs import Index
from kadj.printer import render
from kadj.simplify import simplify
from kadj.simplify_joins import coalesce_joins
from kadj.simplify_scopes import exposed
from kadj.testing import check_grad


def _fn(body, params=("x", "n")):
    return A.Function("f", params, "", body=body)


def _run(fn, *args):
    ns = {}
    exec(render(fn), ns)
    return ns["f"](*args)


def _branch(value_name="t9", last_then=None):
    return A.If("x[0] > 0.0", then=[A.Assign("t7", "x[1] * 2.0"),
                                    last_then or A.Assign(value_name, "t7 + 1.0")],
                orelse=[A.Assign(value_name, "0.5")])


def test_branch_value_is_computed_under_the_kernels_name():
    body = [_branch(), A.Assign("left", "t9"), A.Return("left + t7 if x[0] > 0.0 else left")]
    fn = _fn(body)
    before = copy.deepcopy(fn)
    coalesce_joins(fn, Index(fn))
    src = render(fn)
    assert "t9" not in src and src.count("left = ") == 2, src
    for x in ([1.0, 2.0], [-1.0, 2.0]):
        assert _run(fn, x, 2) == _run(before, x, 2)


def test_branch_value_stays_where_the_name_is_read_or_the_temporary_used_again():
    # the branch reads `left` (its old value): assigning it there would change that read
    reads = _fn([A.Assign("left", "3.0"),
                 A.If("x[0] > 0.0", then=[A.Assign("t9", "left * 2.0")],
                      orelse=[A.Assign("t9", "0.5")]),
                 A.Assign("left", "t9"), A.Return("left")])
    # t9 is read again after the copy
    again = _fn([_branch(), A.Assign("left", "t9"), A.Return("left + t9")])
    # a kernel name, not a temporary, computed in the branches
    named = _fn([_branch("value"), A.Assign("left", "value"), A.Return("left")])
    # a branch's value reads the temporary itself (the previous iteration's value)
    itself = _fn([A.Assign("s", "0.0"), A.For("k", "range(0, n, 1)", body=[
        A.If("k > 0", then=[A.Assign("t9", "t9 + 1.0")], orelse=[A.Assign("t9", "0.5")]),
        A.Assign("left", "t9"), A.Assign("s", "s + left")]), A.Return("s")])
    for fn in (reads, again, named, itself):
        before = render(fn)
        coalesce_joins(fn, Index(fn))
        assert render(fn) == before


def test_loop_counter_counts_in_the_kernels_name():
    loop = A.For("t3", "range(0, n, 1)", body=[
        A.Assign("i", "t3"), A.Assign("s", "s + x[i] * i")])
    fn = _fn([A.Assign("s", "0.0"), A.Assign("i", "-1"), loop, A.Return("s + i")])
    before = copy.deepcopy(fn)
    coalesce_joins(fn, Index(fn))
    assert loop.var == "i" and "t3" not in render(fn), render(fn)
    for x, n in (([1.0, 2.0, 4.0], 3), ([1.0], 0)):     # (no iteration: i stays -1)
        assert _run(fn, x, n) == _run(before, x, n)
    # the body assigns i again: the copy stays
    again = A.For("t3", "range(0, n, 1)", body=[
        A.Assign("i", "t3"), A.Assign("i", "i + 1"), A.Assign("s", "s + x[i - 1]")])
    fn = _fn([A.Assign("s", "0.0"), again, A.Return("s")])
    coalesce_joins(fn, Index(fn))
    assert again.var == "t3"


def test_a_later_if_on_the_same_condition_finds_its_branch_definitions():
    seq = [A.Assign("t5", "x[0] > 0.0"), A.If("t5", then=[A.Assign("t7", "1")]),
           A.If("t5", then=[A.Assign("y", "t7")]),
           A.If("not t5", then=[A.Assign("z", "t7")])]
    def reads(s, **kw):
        return exposed(s, **kw)[0] - {"not", "range"}
    assert reads(seq) == {"x", "t7"}        # read on the other branch only
    assert reads(seq[:3]) == {"x"}
    assert reads(seq[:3], correlate=False) == {"x", "t7"}
    # the condition assigned again in between: the branches are no longer the same
    changed = seq[:2] + [A.Assign("t5", "x[1] > 0.0"), seq[2]]
    assert reads(changed) == {"x", "t7"}
    # ... also inside a loop that runs between them
    looped = seq[:2] + [A.For("k", "range(3)", body=[A.Assign("t5", "k > 1")]), seq[2]]
    assert reads(looped) == {"x", "t7"}


@njit
def _neighbours(x, k, out):
    n = x.shape[0]
    for i in range(n):
        left = x[i - 1] if i > 0 else 0.0
        right = x[i + 1] if i < n - 1 else 0.0
        out[i] = k * (left - 2.0 * x[i] + right)


@njit
def chain_steps(x, k, steps):
    """Explicit steps of a chain of springs, the forces from an inlined helper."""
    f = np.empty(x.shape[0])
    for _ in range(steps):
        _neighbours(x, k, f)
        for i in range(x.shape[0]):
            x[i] += 0.1 * f[i] * f[i]


def test_an_inlined_helper_reads_as_written():
    rng = np.random.default_rng(3)
    args = (rng.standard_normal(7), 0.7, 3)
    src = kadj.differentiate(chain_steps).adjoint_source(*args)
    assert re.search(r"for i_\w*neighbours in range", src), src
    assert re.search(r"left_\w*neighbours = x_work\[i_\w*neighbours - 1\]", src), src
    assert not re.search(r"^\s*\w+ = t\d+$", src, re.M), src
    assert not re.search(r"for (t\d+) in .*:\n\s*\w+ = \1$", src, re.M), src
    check_grad(kadj.differentiate(chain_steps), args)


def test_simplify_keeps_cuda_shapes_when_asked():
    body = [_branch(), A.Assign("left", "t9"), A.Return("left")]
    fn = _fn(body)
    simplify(fn, joins=False)
    assert "left = t9" in render(fn)
