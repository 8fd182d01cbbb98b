"""The readability passes over the adjoint IR (kadj.simplify): each rewrite happens
where it keeps the meaning, and is refused where it would not."""
from kadj import adj_ir as A
from kadj.printer import render
from kadj.simplify import propagate_copies, remove_dead, simplify, source_loop_headers


def v(name):
    return A.AdjVar(name, name)


def elem(base, *index):
    return A.AdjElem(base, (), base, tuple(index))


def fn(*body, params=("x", "adj_x")):
    return A.Function("f_adjoint", params, "doc", [], list(body))


def run(f, **env):
    ns = {}
    exec(render(f), ns)
    return ns["f_adjoint"](**env)


def test_copies_are_propagated_and_dropped():
    f = fn(A.Accumulate(v("adj_a"), "=", "adj_x[0]"),
           A.Accumulate(v("adj_b"), "=", "adj_a"),
           A.Accumulate(v("adj_c"), "=", "adj_b"),
           A.Accumulate(elem("adj_x", "1"), "+=", "adj_c * 2.0"),
           A.Accumulate(elem("adj_x", "2"), "+=", "adj_b"),
           params=("adj_x",))
    propagate_copies(f)
    src = render(f)
    assert "adj_b" not in src and "adj_c" not in src
    assert "adj_x[1] += adj_a * 2.0" in src and "adj_x[2] += adj_a" in src
    adj_x = [3.0, 0.0, 0.0]
    run(f, adj_x=adj_x)
    assert adj_x == [3.0, 6.0, 3.0]


def test_no_propagation_when_the_source_changes_before_a_read():
    f = fn(A.Accumulate(v("adj_a"), "=", "adj_x[0]"),
           A.Accumulate(v("adj_b"), "=", "adj_a"),
           A.Assign(v("adj_a"), "0.0"),
           A.Accumulate(elem("adj_x", "1"), "+=", "adj_b"),
           params=("adj_x",))
    before = render(f)
    propagate_copies(f)
    assert render(f) == before


def test_no_propagation_into_a_loop_that_changes_the_source():
    loop = A.For("k", "range(3)", [A.Accumulate(elem("adj_x", "1"), "+=", "adj_b"),
                                   A.Accumulate(v("adj_a"), "+=", "1.0")])
    f = fn(A.Accumulate(v("adj_a"), "=", "adj_x[0]"),
           A.Accumulate(v("adj_b"), "=", "adj_a"), loop, params=("adj_x",))
    before = render(f)
    propagate_copies(f)
    assert render(f) == before
    adj_x = [1.0, 0.0]
    run(f, adj_x=adj_x)
    assert adj_x == [1.0, 3.0]


def test_no_propagation_of_a_copy_read_before_it_or_assigned_twice():
    # read in an earlier statement of the loop (the previous iteration's copy)
    f = fn(A.Accumulate(v("adj_c"), "=", "adj_x[0]"),
           A.For("k", "range(2)", [A.Accumulate(elem("adj_x", "1"), "+=", "adj_b"),
                                   A.Accumulate(v("adj_b"), "=", "adj_c")]),
           params=("adj_x",))
    before = render(f)
    propagate_copies(f)
    assert render(f) == before
    # assigned twice
    g = fn(A.Accumulate(v("adj_c"), "=", "adj_x[0]"),
           A.Accumulate(v("adj_d"), "=", "adj_x[1]"),
           A.Accumulate(v("adj_b"), "=", "adj_c"),
           A.Accumulate(elem("adj_x", "1"), "+=", "adj_b"),
           A.Accumulate(v("adj_b"), "=", "adj_d"),
           A.Accumulate(elem("adj_x", "2"), "+=", "adj_b"), params=("adj_x",))
    before = render(g)
    propagate_copies(g)
    assert render(g) == before
    adj_x = [1.0, 2.0, 0.0]
    run(g, adj_x=adj_x)
    assert adj_x == [1.0, 3.0, 2.0]


def test_dead_adjoints_are_removed_and_bodies_stay_valid():
    f = fn(A.If("adj_x[0] > 0.0", then=[A.Assign(v("adj_t"), "0.0"),
                                         A.Accumulate(v("adj_t"), "+=", "adj_x[0] * 2.0")]),
           A.Accumulate(v("adj_s"), "=", "adj_x[0]"),
           A.Accumulate(elem("adj_x", "1"), "+=", "adj_s"), params=("adj_x",))
    remove_dead(f)
    propagate_copies(f)
    assert "adj_x[1] += adj_x[0]" not in render(f)  # not a copy: left to folding
    simplify(f)
    src = render(f)
    # the if whose branch lost every statement is dropped (its condition is pure)
    assert "adj_t" not in src and "if " not in src and "adj_x[1] += adj_x[0]" in src
    adj_x = [2.0, 0.0]
    run(f, adj_x=adj_x)
    assert adj_x == [2.0, 2.0]


def test_empty_if_on_an_impure_condition_is_kept():
    f = fn(A.If("record(adj_x[0]) > 0.0", then=[A.Assign(v("adj_t"), "0.0")]),
           A.Accumulate(elem("adj_x", "1"), "+=", "adj_x[0]"), params=("adj_x",))
    simplify(f)
    src = render(f)
    assert "if record(adj_x[0]) > 0.0:" in src and "pass" in src


def test_impure_or_atomic_accumulations_are_kept():
    f = fn(A.Accumulate(v("adj_t"), "=", "record(adj_x[0])"),
           A.Accumulate(elem("adj_x", "1"), "+=", "1.0", "atomic"), params=("adj_x",))
    remove_dead(f)
    assert len(f.body) == 2


def test_reversed_loop_headers_from_the_source_line():
    def loop(src, var, rng):
        return A.ReverseLoop("taped", 0, [A.Comment(f"# k.py:3: {src}"),
                                          A.Comment(f"# reversed: for {var} in {rng}")])
    same = loop("for i in range(1, u.shape[0] - 1):", "i", "range(1, t3, 1)")
    other_var = loop("for i in range(n):", "t3", "range(0, n_rhs, 1)")
    prange = loop("for i in prange(n):", "i", "range(0, n, 1)")
    trailing = loop("for i in range(n):  # note", "i", "range(0, n, 1)")
    f = fn(same, other_var, prange, trailing)
    source_loop_headers(f)
    assert same.body[1].text == "# reversed: for i in range(1, u.shape[0] - 1)"
    assert other_var.body[1].text == "# reversed: for t3 in range(0, n_rhs, 1)"
    assert prange.body[1].text == "# reversed: for i in range(0, n, 1)"
    assert trailing.body[1].text == "# reversed: for i in range(0, n, 1)"


def test_names_in_plain_text_targets_are_never_removed():
    # a pop (the tape moves) or a plain target's text may mention the name
    f = fn(A.Pop("f64", "adj_t"), A.Accumulate(v("adj_t"), "=", "1.0"), params=("adj_x",))
    remove_dead(f)
    assert len(f.body) == 2
