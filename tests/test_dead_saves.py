"""Saves that no restore needs (kadj/dead_saves.py): the gallery adjoints that lose
them, their gradients against finite differences and, bit for bit, against the adjoint
that keeps them; the liveness on hand-built adjoint IR, with the cases that must keep
a save (a value read in the next iteration, after a ``continue``, after a ``break``, by
a reservation, a site whose saves and restores do not pair up)."""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj.dead_saves import dead_restores, drop_dead_saves
from kadj.tape_measure import adjoint_buffers
from kadj.testing import check_grad
from kernels.cpu import GALLERY

_BY_NAME = {ex.name: ex for ex in GALLERY}


def _source(name, args):
    ex = _BY_NAME[name]
    return kadj.differentiate(ex.kernel, wrt=ex.wrt).adjoint_source(*args)


def test_logsumexp_records_nothing():
    args = _BY_NAME["logsumexp"].sized(np.random.default_rng(0), 50)
    src = _source("logsumexp", args)
    assert "_tape_" not in src and "restore m" not in src, src
    check_grad(kadj.differentiate(_BY_NAME["logsumexp"].kernel), args)


def test_softmax_rows_in_place_keeps_only_the_saves_its_reverse_reads():
    ex = _BY_NAME["softmax_rows_inplace"]
    args = ex.sized(np.random.default_rng(1), 600)
    src = _source(ex.name, args)
    assert "restore s" not in src and "save s " not in src, src
    assert "restore t15" in src or "restore t" in src     # the quotient's old value
    check_grad(kadj.differentiate(ex.kernel), args)


@pytest.mark.parametrize("name", ["logsumexp", "softmax_rows_inplace", "softmax_f32",
                                  "first_crossing", "bracket_interp",
                                  "thomas_batched_private"])
def test_gradient_is_the_same_bit_for_bit_as_with_the_saves(name, monkeypatch):
    ex = _BY_NAME[name]
    args = ex.sized(np.random.default_rng(2), 400)
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    got, src = _gradient(ex, args)
    import kadj.reverse as reverse
    monkeypatch.setattr(reverse, "drop_dead_saves", lambda fn: 0)
    want, kept_src = _gradient(ex, args)
    assert src != kept_src      # the pass changed this adjoint
    for g, w in zip(got, want):
        assert np.array_equal(g, w, equal_nan=True)


def _gradient(ex, args):
    """The adjoints of every argument for random cotangents, and the source."""
    k = kadj.differentiate(njit(ex.kernel.py_func), wrt=ex.wrt)
    src = k.adjoint_source(*args)
    rng = np.random.default_rng(7)
    bufs = [rng.standard_normal(b.shape).astype(b.dtype)
            for b in adjoint_buffers(k.adjoint_plan(*args), args, fill=0.0)]
    k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], *bufs)
    return bufs, src


# ---- on hand-built adjoint IR ----------------------------------------------------------
def _push(v, site):
    return [A.CapacityCheck(kind="f64", frame=None, seq=0),
            A.Push("f64", v, site=site)]


def _pop(v, site):
    return A.Pop("f64", v, site=site)


def _kinds(fn):
    return [type(x).__name__ for x in A.walk(fn.prologue + fn.body)]


def _fn(body):
    return A.Function("f", ("x",), "", prologue=[A.TapeDecl("f64")], body=body)


def test_a_restore_assigned_again_before_any_read_goes_with_its_save():
    body = _push("v", 1) + [A.Assign("v", "x * 2.0"), _pop("v", 1),
                            A.Assign("v", "0.0"), A.Assign("y", "v + 1.0")]
    fn = _fn(body)
    assert drop_dead_saves(fn) == 1
    assert "Push" not in _kinds(fn) and "Pop" not in _kinds(fn)
    assert "CapacityCheck" not in _kinds(fn) and "TapeDecl" not in _kinds(fn)


def test_a_value_read_in_the_next_iteration_is_kept():
    loop = A.For("i", "range(5)", body=[A.Assign("y", "v * x"), _pop("v", 1)])
    fn = _fn(_push("v", 1) + [loop])
    assert drop_dead_saves(fn) == 0 and "Pop" in _kinds(fn)


def test_a_value_read_after_a_continue_at_the_loop_head_is_kept():
    loop = A.For("i", "range(5)", body=[
        A.Assign("y", "v * x"),
        A.If("x > 0", then=[_pop("v", 1), A.Continue()]),
        A.Assign("v", "1.0")])
    fn = _fn(_push("v", 1) + [loop])
    assert drop_dead_saves(fn) == 0


def test_a_value_read_after_a_break_leaves_the_loop_is_kept():
    loop = A.While("True", body=[
        A.If("x > 0", then=[_pop("v", 1), A.Break()]),
        A.Assign("v", "1.0")])
    fn = _fn(_push("v", 1) + [loop, A.Assign("y", "v")])
    assert drop_dead_saves(fn) == 0
    fn = _fn(_push("v", 1) + [loop, A.Assign("v", "2.0"), A.Assign("y", "v")])
    assert drop_dead_saves(fn) == 1


def test_a_value_a_reservation_reads_is_kept():
    hoist = {"assigned": set(), "amounts": {"f64": ["2 * max(0, v)"]}}
    fn = _fn(_push("v", 1) + [_pop("v", 1), A.Reserve(frame=None, hoist=hoist)])
    assert drop_dead_saves(fn) == 0


def test_a_comment_naming_the_value_does_not_read_it():
    fn = _fn(_push("v", 1) + [_pop("v", 1), A.Comment("# y = v + 1")])
    assert drop_dead_saves(fn) == 1


def test_every_restore_of_a_site_must_be_dead():
    branch = A.If("x > 0", then=[_pop("v", 1), A.Assign("y", "v")],
                  orelse=[_pop("v", 1)])
    fn = _fn(_push("v", 1) + _push("v", 1) + [branch])
    assert len(dead_restores(fn)) == 1
    assert drop_dead_saves(fn) == 0
    assert _kinds(fn).count("Pop") == 2 and _kinds(fn).count("Push") == 2


def test_saves_and_restores_that_do_not_pair_up_are_kept():
    fn = _fn(_push("v", 1) + _push("v", 1) + [_pop("v", 1)])
    assert dead_restores(fn) and drop_dead_saves(fn) == 0


def test_an_unmarked_restore_is_never_removed():
    fn = _fn(_push("v", None) + [_pop("v", None)])
    assert drop_dead_saves(fn) == 0 and "Pop" in _kinds(fn)


def test_a_branch_left_empty_goes_and_another_tape_stays():
    fresh = A.If("i > 0", then=[A.Comment("# the previous iteration's values")] +
                 _push("v", 1), fresh=True)
    loop = A.For("i", "range(3)", body=[fresh, A.Assign("v", "x * i")])
    back = A.If("i > 0", then=[_pop("v", 1)])
    reverse = A.For("i", "range(2, -1, -1)", body=[A.Assign("y", "x"), back])
    keep = [A.Push("i64", "k", site=2), A.Assign("k", "1"), A.Pop("i64", "k", site=2),
            A.Assign("y", "k")]
    fn = A.Function("f", ("x",), "", prologue=[A.TapeDecl("f64"), A.TapeDecl("i64")],
                    body=[loop, reverse] + keep)
    assert drop_dead_saves(fn) == 1
    assert [type(x).__name__ for x in loop.body] == ["Assign"]
    assert [type(x).__name__ for x in reverse.body] == ["Assign"]
    assert [x.kind for x in fn.prologue] == ["i64"]
