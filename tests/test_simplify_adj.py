"""The adjoint-IR passes of kadj/simplify_adj.py (resets sunk into the accumulation
that follows, copies of an adjoint replaced by the adjoint itself) and
kadj/simplify_scopes.py (top-level blocks that reuse names simplified each on its own),
on hand-built IR and on generated adjoints whose gradients are checked against an
analytic formula."""
import copy
import re

import numpy as np
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj.printer import render
from kadj.simplify import simplify
from kadj.simplify_adj import sink_resets
from kadj.simplify_scopes import exposed, join_scopes, split_scopes


def _v(name):
    return A.AdjVar(name, name)


def _fn(body, params=("x", "adj_c")):
    return A.Function("f", params, "", body=body)


def test_reset_becomes_the_definition_and_moves_past_copy_reads():
    body = [A.Accumulate(_v("adj_t"), "=", "adj_p"),
            A.Assign(_v("adj_p"), "0.0"),
            A.Accumulate(_v("adj_p"), "+=", "adj_t * x"),
            A.Accumulate(A.Local("acc"), "+=", "adj_t * p")]
    sink_resets(_fn(body))
    assert [(type(s).__name__, s.op, s.value) for s in body] == [
        ("Accumulate", "=", "adj_p"), ("Accumulate", "+=", "adj_t * p"),
        ("Accumulate", "=", "adj_t * x")]


def test_reset_stays_when_something_reads_the_adjoint_in_between():
    body = [A.Assign(_v("adj_p"), "0.0"),
            A.Accumulate(A.Local("acc"), "+=", "adj_p"),
            A.Accumulate(_v("adj_p"), "+=", "x")]
    sink_resets(_fn(body))
    assert len(body) == 3 and body[2].op == "+="
    # a jump between: the reset is what the loop left with
    body = [A.Assign(_v("adj_p"), "0.0"), A.If("c", then=[A.Break()]),
            A.Accumulate(_v("adj_p"), "+=", "x")]
    sink_resets(_fn(body))
    assert len(body) == 3 and body[2].op == "+="


def test_definition_does_not_move_past_what_changes_its_operands():
    body = [A.Accumulate(_v("adj_t"), "=", "adj_p"),
            A.Assign(_v("adj_p"), "0.0"),
            A.Accumulate(_v("adj_p"), "+=", "adj_t * x"),
            A.Assign("x", "2.0"),
            A.Accumulate(A.Local("acc"), "+=", "adj_t")]
    sink_resets(_fn(body))
    assert body[1].op == "=" and body[1].value == "adj_t * x"


def test_definition_stops_right_after_the_last_read_of_a_copy():
    # the statement after the last read of a copy adds to adj_v itself: the definition
    # goes between them (a regression: it went one statement too far, past that
    # addition, which it then overwrote: a CUDA thread's own element updated in place,
    # ``y[i] = 0.5 * y[i] + math.sin(s * y[i])``, lost its 0.5)
    body = [A.Accumulate(_v("adj_t"), "=", "adj_p"),
            A.Assign(_v("adj_p"), "0.0"),
            A.Accumulate(_v("adj_p"), "+=", "adj_u * s"),
            A.Accumulate(_v("adj_w"), "=", "adj_t * 0.5"),
            A.Accumulate(_v("adj_p"), "+=", "adj_w")]
    sink_resets(_fn(body))
    assert [(s.target.name, s.op, s.value) for s in body] == [
        ("adj_t", "=", "adj_p"), ("adj_w", "=", "adj_t * 0.5"),
        ("adj_p", "=", "adj_u * s"), ("adj_p", "+=", "adj_w")]


def test_definition_moves_past_the_uses_of_what_copy_reads_computed():
    # ``adj_w`` computed from a copy is added into an accumulator after it: the
    # definition moves past that too (then ``adj_w`` folds into its use), but stops
    # before a statement that reads adj_p
    body = [A.Accumulate(_v("adj_t"), "=", "adj_p"),
            A.Assign(_v("adj_p"), "0.0"),
            A.Accumulate(_v("adj_p"), "+=", "adj_t * x"),
            A.Accumulate(_v("adj_w"), "=", "adj_t * p"),
            A.Accumulate(A.Local("acc"), "+=", "adj_w"),
            A.Accumulate(A.Local("acc2"), "+=", "adj_w * adj_p")]
    sink_resets(_fn(body))
    assert [s.value for s in body] == ["adj_p", "adj_t * p", "adj_w", "adj_t * x",
                                       "adj_w * adj_p"]


def test_reset_and_readding_a_copy_cancel():
    body = [A.Accumulate(_v("adj_t"), "=", "adj_p"),
            A.Assign(_v("adj_p"), "0.0"),
            A.Accumulate(_v("adj_u"), "=", "adj_t"),
            A.Accumulate(_v("adj_p"), "+=", "adj_u"),
            A.Accumulate(A.Local("acc"), "+=", "adj_u")]
    sink_resets(_fn(body))
    assert [s.target.name for s in body] == ["adj_t", "adj_u", "acc"]


def test_exposed_names():
    seq = [A.Assign("a", "b + 1"), A.If("a", then=[A.Assign("c", "a")]),
           A.Accumulate(_v("adj_d"), "+=", "c")]
    reads, defined = exposed(seq)
    assert reads == {"b", "c", "adj_d"} and defined == {"a", "adj_d"}


def test_blocks_reusing_a_name_are_simplified_each_on_its_own():
    def block(off):
        return A.If(f"ok{off}", then=[
            A.Assign("t", f"x[{off}]"),
            A.Accumulate(_v("adj_t"), "=", "adj_y"),
            A.Accumulate(A.Local("acc"), "+=", "adj_t * t")])
    fn = _fn([block(0), block(1), A.Return("acc")], params=("x", "adj_y"))
    fn.temps = frozenset({"t"})
    scopes = split_scopes(fn)
    assert sorted(new for _, _, new in scopes) == ["adj_t_2", "adj_t_3", "t_2", "t_3"]
    join_scopes(fn, scopes)
    simplify(fn)
    # the copies adj_t = adj_y of both blocks propagated; the names given back
    assert [b.then[-1].value for b in fn.body[:2]] == ["adj_y * t", "adj_y * t"]
    assert [b.then[0].value for b in fn.body[:2]] == ["x[0]", "x[1]"]
    assert "t_2" not in str(fn.body) and "adj_t" not in str(fn.body)
    # a name read after the block is not the block's own
    fn = _fn([block(0), A.Return("t")])
    assert split_scopes(fn) == [] and join_scopes(fn, []) is fn


def test_loops_reusing_a_name_are_simplified_each_on_its_own():
    """A forward loop and the reversed loop that recomputes its values define the same
    temporaries: each loop's own are told apart while the passes run, so that a copy or
    a cast in one is simplified as if it were the only definition."""
    def loop(var):
        return A.For(var, "range(0, n, 1)", body=[
            A.Assign("t1", f"x[{var}] < 0.5"), A.Assign("t2", "bool(t1)"),
            A.If("t2", then=[A.Assign("t3", f"x[{var}]"), A.Assign("s", "s + t3")])])
    carried = A.For("j", "range(0, n, 1)", body=[
        A.Assign("t4", "t5 + 1.0"), A.Assign("t5", "x[j]")])     # t5: from the last trip
    fn = _fn([A.Assign("s", "0.0"), A.Assign("t5", "0.0"), loop("i"), carried, loop("k"),
              A.Return("s + t5")], params=("x", "n"))
    fn.temps = frozenset({"t1", "t2", "t3", "t4", "t5"})
    before = copy.deepcopy(fn)
    scopes = split_scopes(copy.deepcopy(fn))
    assert {old for _, old, _ in scopes} == {"t1", "t2", "t3"}     # not t5, not s
    simplify(fn)
    src = render(fn)
    assert "bool(" not in src and "t3 =" not in src, src
    assert src.count("if x[i] < 0.5:") + src.count("t1 = x[i] < 0.5") >= 1, src
    for x in (np.array([0.25, 0.75, 0.125]), np.array([0.9, 0.1, 0.3, 0.2])):
        got, want = {}, {}
        exec(render(fn), got)
        exec(render(before), want)
        assert got["f"](x, x.shape[0]) == want["f"](x, x.shape[0])


def test_a_helper_with_branches_recomputes_only_what_its_reverse_reads():
    from kernels.cpu.reductions import huber_loss     # (its branches in a helper)
    target = np.zeros(5)
    src = kadj.differentiate(huber_loss).adjoint_source(np.array([0.3, -2.0]),
                                                       np.zeros(2), 1.0)
    assert "bool(" not in src, src
    # no copy of a copy (the branches' return values), in the forward nor the recompute
    assert not re.search(r"^\s*t\d+ = t\d+$", src, re.M), src
    reverse = src[src.index("# ---- reverse sweep ----"):]
    assert "0.5 * delta" in reverse and "delta_huber * t" not in reverse, src
    x = np.array([0.3, -2.0, 0.9, 1.5, -0.2])
    adj_x = np.zeros(5)
    kadj.differentiate(huber_loss).adjoint(x, target, 1.0, adj_x, np.zeros(5),
                                           np.zeros(1), adj_return=1.0)
    np.testing.assert_allclose(adj_x, np.clip(x, -1.0, 1.0) / 5, rtol=1e-15)


@njit
def horner(x, c, out):
    for i in range(x.shape[0]):
        p = c[c.shape[0] - 1]
        for k in range(c.shape[0] - 2, -1, -1):
            p = p * x[i] + c[k]
        out[i] = p


def test_horner_reads_as_written_by_hand_and_is_exact():
    k = kadj.differentiate(horner)
    x, c = np.array([0.5, -1.5, 2.0]), np.array([1.0, -2.0, 0.5, 3.0])
    src = k.adjoint_source(x, c, np.zeros(3))
    body = [line.strip() for line in src.splitlines()]
    i = body.index("adj_c[k] += adj_p")
    assert body[i + 1:i + 3] == ["_acc_x1 = _sum_add(_acc_x1, adj_p * p)",
                                 "adj_p = adj_p * x_i"]
    assert "adj_p = 0.0" not in body[i - 5:i]
    # the adjoint against the analytic derivatives of p(x) = sum c_k x^k
    adj_out = np.array([1.0, 2.0, -0.5])
    adj_x, adj_c = np.zeros(3), np.zeros(4)
    k.adjoint(x, c, np.zeros(3), adj_x, adj_c, adj_out.copy())
    powers = x[:, None] ** np.arange(4)
    dpdx = (np.arange(1, 4) * c[1:] * x[:, None] ** np.arange(3)).sum(axis=1)
    np.testing.assert_allclose(adj_c, adj_out @ powers, rtol=1e-13)
    np.testing.assert_allclose(adj_x, adj_out * dpdx, rtol=1e-13)


def test_an_element_added_back_whole_keeps_its_adjoint():
    """adj_t = adj_y[j]; adj_y[j] = 0.0; ...; adj_y[j] += adj_t: the reset and the
    re-addition go; anything between that touches adj_y, adj_t or j keeps them."""
    from kadj.simplify_adj import keep_readded_elements

    def elem(base, *index):
        return A.AdjElem(base[4:], (), base, index)

    def body(*between):
        return [A.Accumulate(_v("adj_t"), "=", "adj_y[j]"),
                A.Consume(elem("adj_y", "j"), "0.0"),
                A.Accumulate(elem("adj_x", "k"), "+=", "adj_t * w"),
                *between,
                A.Accumulate(elem("adj_y", "j"), "+=", "adj_t")]
    b = body()
    assert keep_readded_elements(_fn(b)) == 1
    assert [type(s).__name__ for s in b] == ["Accumulate", "Accumulate"]
    for between in ([A.Accumulate(elem("adj_y", "i"), "+=", "1.0")],   # another element
                    [A.Assign("j", "j + 1")],                          # j changes
                    [A.Accumulate(_v("adj_t"), "+=", "1.0")],          # adj_t changes
                    [A.If("c", [A.Assign(A.AdjVar("s", "adj_s"), "adj_y[0]")])]):
        b = body(*between)
        assert keep_readded_elements(_fn(b)) == 0 and len(b) == 5


def test_in_place_update_adjoint_keeps_its_outputs_adjoint():
    from fdcheck import fd_check

    @njit
    def axpy_in_place(x, y, a):
        for i in range(x.shape[0]):
            y[i] = y[i] + a * x[i] * x[i]
    args = (np.linspace(0.1, 1.0, 7), np.linspace(-1.0, 1.0, 7), 0.3)
    k = kadj.differentiate(axpy_in_place)
    src = k.adjoint_source(*args)
    assert "adj_y[i] = 0.0" not in src and "adj_y[i] +=" not in src, src
    fd_check(k, args)
