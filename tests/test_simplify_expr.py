"""The expression passes over the adjoint IR (kadj.simplify_expr): temporaries folded
into their one use, bool() of a comparison dropped, repeated accumulations merged; each
refused where it would change what the code computes.  Every case runs the code before
and after and compares."""
import copy

from kadj import adj_ir as A
from kadj.printer import render
from kadj.simplify_expr import (drop_bool_casts, fold_single_uses, merge_accumulations,
                                unwrap_bool_of_compare)


def v(name):
    return A.AdjVar(name, name)


def elem(base, *index):
    return A.AdjElem(base, (), base, tuple(index))


def fn(*body):
    return A.Function("f_adjoint", ("x", "adj_x", "i"), "doc", [], list(body))


def run(f, x=None, adj_x=None, i=1):
    x = [1.0, 2.0, 3.0, 4.0] if x is None else x
    adj_x = [0.5, 0.25, 4.0, 1.0] if adj_x is None else adj_x
    ns = {"math": __import__("math")}
    exec(render(f), ns)
    ns["f_adjoint"](x, adj_x, i)
    return x, adj_x


def same_result(f, rewrite):
    """``rewrite(f)`` applied; the rewritten code computes what the original did."""
    before = copy.deepcopy(f)
    rewrite(f)
    assert run(f) == run(before)
    return render(f)


def test_a_chain_of_single_use_temporaries_becomes_one_expression():
    f = fn(A.Assign("t1", "i - 1"), A.Assign("t2", "x[t1]"), A.Assign("t3", "x[i]"),
           A.Assign("t4", "2.0 * t3"), A.Assign("t5", "t2 - t4"),
           A.Assign("x[3]", "t5 + 1.0"))
    src = same_result(f, fold_single_uses)
    assert "x[3] = x[i - 1] - 2.0 * x[i] + 1.0" in src and "t1" not in src


def test_no_fold_past_a_store_or_a_new_operand_value():
    store = fn(A.Assign("t1", "x[0]"), A.Assign("x[0]", "5.0"), A.Assign("x[1]", "t1 + 1.0"))
    assert "x[1] = x[0] + 1.0" not in same_result(store, fold_single_uses)
    other = fn(A.Assign("t1", "x[0]"), A.Assign("x[2]", "5.0"), A.Assign("x[1]", "t1"))
    assert "t1" in same_result(other, fold_single_uses)   # (another element: may alias)
    operand = fn(A.Assign("k", "i"), A.Assign("t1", "k + 1"), A.Assign("k", "0"),
                 A.Assign("x[1]", "t1 * 1.0"))
    assert "t1" in same_result(operand, fold_single_uses)
    pop = fn(A.Assign("t1", "x[0] * 2.0"), A.Assign("x[0]", "1.0"), A.Assign("t2", "x[0]"),
             A.Assign("x[1]", "t1 + t2"))
    src = same_result(pop, fold_single_uses)
    assert "t1 = x[0] * 2.0" in src and "x[1] = t1 + x[0]" in src


def test_no_fold_into_tape_loops_conditions_or_reads_by_the_adjoint():
    loop = fn(A.Assign("t1", "x[0]"), A.For("k", "range(2)", [A.Assign("x[1]", "t1")]))
    assert "t1 = x[0]" in same_result(loop, fold_single_uses)
    header = fn(A.Assign("t1", "i + 1"), A.For("k", "range(t1)", [A.Assign("x[1]", "1.0")]))
    assert "t1 = i + 1" in same_result(header, fold_single_uses)
    push = fn(A.Assign("t1", "x[0]"), A.Push("f64", "t1"))
    fold_single_uses(push)
    assert "t1 = x[0]" in render(push)
    adjoint = fn(A.Assign("t1", "x[0] * 2.0"), A.Accumulate(elem("adj_x", "1"), "+=", "t1"))
    assert "t1 = x[0] * 2.0" in same_result(adjoint, fold_single_uses)
    twice = fn(A.Assign("t1", "x[0] + 1.0"), A.Assign("x[1]", "t1 * t1"))
    assert "t1 = x[0] + 1.0" in same_result(twice, fold_single_uses)
    wide = fn(A.Assign("t1", " + ".join(["x[0]"] * 12)), A.Assign("x[1]", "t1 * 3.0"))
    assert "t1 = " in same_result(wide, fold_single_uses)


def test_adjoint_chains_fold_into_their_accumulation():
    f = fn(A.Accumulate(v("adj_a"), "=", "adj_x[0]"),
           A.Consume(elem("adj_x", "0"), "0.0"),
           A.Accumulate(v("adj_b"), "=", "-adj_a"),
           A.Accumulate(v("adj_c"), "=", "adj_b * 2.0"),
           A.Accumulate(elem("adj_x", "i"), "+=", "adj_c"))
    src = same_result(f, fold_single_uses)
    # adj_a stays: its load may not pass the store that zeroes the element
    assert "adj_a = adj_x[0]" in src and "adj_x[i] += -adj_a * 2.0" in src


def test_bool_of_a_comparison_is_the_comparison():
    f = fn(A.Assign("t1", "x[0] < x[1]"), A.Assign("t2", "bool(t1)"),
           A.If("t2", [A.Assign("x[2]", "1.0")]), A.If("t2", [A.Assign("x[3]", "1.0")]))
    src = same_result(f, drop_bool_casts)
    assert "bool" not in src and src.count("if t1:") == 2
    g = fn(A.Assign("t1", "x[0]"), A.Assign("t2", "bool(t1)"),
           A.If("t2", [A.Assign("x[2]", "1.0")]))
    assert "bool(t1)" in same_result(g, drop_bool_casts)   # not a comparison


def test_bool_of_a_folded_comparison_is_the_comparison():
    f = fn(A.Assign("t2", "bool(x[0] < x[1] - 1.0)"), A.If("t2", [A.Assign("x[2]", "1.0")]),
           A.Assign("t3", "bool(x[3])"), A.Assign("t4", "bool(x[0] < 2.0) + 1"),
           A.If("t3", [A.Assign("x[1]", "t4")]))
    src = same_result(f, unwrap_bool_of_compare)
    assert "t2 = x[0] < x[1] - 1.0\n" in src
    # not a comparison, or the cast only part of the value: left as they are
    assert "t3 = bool(x[3])" in src and "t4 = bool(x[0] < 2.0) + 1" in src


def test_repeated_accumulations_into_one_element_merge():
    f = fn(A.Accumulate(elem("adj_x", "i"), "+=", "math.cos(i) * 2.0", "plain"),
           A.Accumulate(elem("adj_x", "i - 1"), "+=", "x[1]", "plain"),
           A.Accumulate(elem("adj_x", "i"), "+=", "i - 3.0", "plain"))
    src = same_result(f, merge_accumulations)
    assert "adj_x[i] += math.cos(i) * 2.0 + (i - 3.0)" in src
    assert src.count("adj_x[i] +=") == 1
    # a value that reads memory does not move past a store
    g = fn(A.Accumulate(elem("adj_x", "i"), "+=", "x[0] * 2.0", "plain"),
           A.Accumulate(elem("adj_x", "i - 1"), "+=", "x[1]", "plain"),
           A.Accumulate(elem("adj_x", "i"), "+=", "1.0", "plain"))
    assert same_result(g, merge_accumulations).count("adj_x[i] +=") == 2


def test_no_merge_past_a_read_an_index_change_or_atomics():
    read = fn(A.Accumulate(elem("adj_x", "i"), "+=", "1.0", "plain"),
              A.Accumulate(v("adj_t"), "=", "adj_x[1]"),
              A.Accumulate(elem("adj_x", "3"), "+=", "adj_t", "plain"),
              A.Accumulate(elem("adj_x", "i"), "+=", "2.0", "plain"))
    assert same_result(read, merge_accumulations).count("adj_x[i] +=") == 2
    index = fn(A.Accumulate(elem("adj_x", "i"), "+=", "1.0", "plain"),
               A.Assign("i", "i + 1"),
               A.Accumulate(elem("adj_x", "i"), "+=", "2.0", "plain"))
    assert same_result(index, merge_accumulations).count("adj_x[i] +=") == 2
    self_read = fn(A.Accumulate(elem("adj_x", "i"), "+=", "1.0", "plain"),
                   A.Accumulate(elem("adj_x", "i"), "+=", "adj_x[i] * 2.0", "plain"))
    assert same_result(self_read, merge_accumulations).count("adj_x[i] +=") == 2
    atomic = fn(A.Accumulate(elem("adj_x", "i"), "+=", "1.0", "atomic"),
                A.Accumulate(elem("adj_x", "i"), "+=", "2.0", "atomic"))
    merge_accumulations(atomic)
    assert len(atomic.body) == 2


def test_index_offsets_are_spelled_out_where_read():
    from kadj.simplify_expr import inline_index_offsets
    f = fn(A.Assign("t1", "i - 1"), A.Assign("t2", "x[t1] * 2.0"),
           A.Accumulate(elem("adj_x", "t1"), "+=", "t2", "plain"))
    src = same_result(f, inline_index_offsets)
    assert "t1" not in src and "t2 = x[i - 1] * 2.0" in src and "adj_x[i - 1] += t2" in src
    # i changes before a read: kept
    g = fn(A.Assign("t1", "i - 1"), A.Assign("i", "i + 1"),
           A.Accumulate(elem("adj_x", "t1"), "+=", "1.0", "plain"))
    assert "t1 = i - 1" in same_result(g, inline_index_offsets)
    # read inside a loop, or pushed: kept
    h = fn(A.Assign("t1", "i + 1"),
           A.For("k", "range(2)", [A.Accumulate(elem("adj_x", "t1"), "+=", "1.0", "plain")]))
    assert "t1 = i + 1" in same_result(h, inline_index_offsets)
    p = fn(A.Assign("t1", "i + 1"), A.Push("i64", "t1"))
    inline_index_offsets(p)
    assert "t1 = i + 1" in render(p)
