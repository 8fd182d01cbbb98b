"""Where names occur in an adjoint IR (kadj.adj_refs): the index the readability passes
share, kept between passes and computed again after a change, must always equal an
index computed from scratch; simplify with the shared index prints what the passes
run one by one (each indexing for itself) print."""
import copy

from kadj import adj_ir as A
from kadj.adj_refs import Index, index, names, rewrite
from kadj.printer import render
from kadj.simplify import (_fill_empty_bodies, propagate_copies, remove_dead, simplify,
                           source_loop_headers)
from kadj.simplify_expr import (drop_bool_casts, drop_orphan_comments, fold_single_uses,
                                inline_index_offsets, merge_accumulations)


def v(name):
    return A.AdjVar(name, name)


def elem(base, *index):
    return A.AdjElem(base, (), base, tuple(index))


def plain(occ_path):
    """An index with nodes by identity, comparable with ``==``."""
    occ, path = occ_path
    return ({n: [(role, id(node)) for role, node in rows] for n, rows in occ.items()},
            dict(path))


def sample():
    return A.Function("f_adjoint", ("x", "adj_x", "i"), "doc", [], [
        A.Comment("# k.py:3: y = x[i - 1] < x[i]"),
        A.Assign("t1", "i - 1"),
        A.Assign("t2", "x[t1]"),
        A.Assign("t3", "t2 < x[i]"),
        A.Assign("t4", "bool(t3)"),
        A.If("t4", [A.Accumulate(elem("adj_x", "t1"), "+=", "x[0]", how="plain")], []),
        A.Accumulate(v("adj_a"), "=", "adj_x[i]"),
        A.Accumulate(v("adj_b"), "=", "adj_a"),
        A.Accumulate(v("adj_dead"), "=", "adj_b * 3.0"),
        A.Assign("t5", "x[i] * 2.0"),
        A.Accumulate(elem("adj_x", "0"), "+=", "adj_b * t5", how="plain"),
        A.Accumulate(elem("adj_x", "0"), "+=", "adj_b", how="plain"),
        A.Assign("t6", "i + 1"),
        A.Assign("t7", "x[t6]"),
        A.Accumulate(elem("adj_x", "t6"), "+=", "t7 * 0.5", how="plain"),
        A.Return("None"),
    ])


def run(f):
    x, adj_x = [1.0, 2.0, 3.0, 0.5], [0.5, 0.25, 4.0, 1.0]
    ns = {"math": __import__("math")}
    exec(render(f), ns)
    ns["f_adjoint"](x, adj_x, 2)
    return x, adj_x


def test_the_kept_index_follows_every_change():
    f = sample()
    idx = Index(f)
    first = idx.get()
    assert idx.get() is first            # kept while nothing changed
    acc = f.body[5].then[0]
    rewrite(acc, "t1", "i")              # a new target object and the same value text
    f.body[6].value = "adj_x[t1]"        # a new value text
    f.body[10].target = elem("adj_x", "t5")
    del f.body[9]
    idx.changed()
    again = idx.get()
    assert again is not first
    assert plain(again) == plain(index(f))
    assert [id(n) for r, n in again[0]["t1"] if r == "use"] == [id(f.body[2]),
                                                                 id(f.body[6])]
    assert "t5" in again[0] and again[0]["t5"][0][1] is f.body[9]


def test_simplify_with_one_index_prints_what_separate_passes_print():
    shared, alone, before = sample(), sample(), sample()
    simplify(shared)
    for one_pass in (propagate_copies, remove_dead, drop_bool_casts, fold_single_uses,
                     inline_index_offsets, fold_single_uses, merge_accumulations,
                     drop_orphan_comments, source_loop_headers):
        one_pass(alone)
    _fill_empty_bodies([alone])
    text = render(shared)
    assert text == render(alone)
    assert "adj_b" not in text and "adj_dead" not in text and "bool(" not in text
    assert "t3 = x[t1] < x[i]" in text and "adj_x[0] += adj_a * t5 + adj_a" in text
    assert "t7 = x[i + 1]" in text and "adj_x[i + 1] += t7 * 0.5" in text
    assert run(shared) == run(before)


def test_simplify_on_a_copy_is_repeatable():
    f = sample()
    g = copy.deepcopy(f)
    assert render(simplify(f)) == render(simplify(g))


def test_names_are_read_once_per_text():
    assert names("a + b[i] * math.sin(c)") == ("a", "b", "i", "math", "c")
    assert names(None) == ()
    assert names("x.y") is names("x.y")


def _same_occurrences(idx, f):
    """The kept index equals one computed afresh (rows in any order), and its
    positions are the fresh paths' positions."""
    fresh, path = index(f)
    kept = idx.occ()
    assert {n: sorted((r, id(x)) for r, x in rows) for n, rows in kept.items()} == \
        {n: sorted((r, id(x)) for r, x in rows) for n, rows in fresh.items()}
    for seq in idx.lists():
        for pos, x in enumerate(seq):
            assert idx.where(x, seq) == pos
            for rows in fresh.values():
                for _, node in rows:
                    want = [p for lst, p in path[id(node)] if lst == id(seq)]
                    assert idx.at(node, seq) == (want[0] if want else None)


def test_the_index_told_of_each_change_equals_a_fresh_one():
    from kadj.simplify_primal import remove_unused_primal
    f = sample()
    f.body.insert(1, A.Assign("unused", "x[i] + 1.0"))      # for remove_unused_primal
    f.body.insert(2, A.If("t0", [A.Assign("t9", "2.0")], [A.Pass()]))
    idx = Index(f)
    idx.occ()
    steps = [lambda: propagate_copies(f, idx), lambda: remove_dead(f, idx),
             lambda: remove_unused_primal(f, idx), lambda: drop_bool_casts(f, idx),
             lambda: fold_single_uses(f, idx=idx), lambda: inline_index_offsets(f, idx=idx),
             lambda: fold_single_uses(f, idx=idx), lambda: merge_accumulations(f, idx=idx)]
    before = render(f)
    for step in steps:
        step()
        _same_occurrences(idx, f)
    after = render(f)
    assert after != before and "unused" not in after and "t9" not in after
    assert "adj_b" not in after and "bool(" not in after
    assert run(f) == run(sample())
