"""kadj.cuda.guard_hoist: the gather form's guard comparisons are moved in front of
their branches only where that cannot change what the kernel computes (the gradients
of the gather-form kernels are checked in tests/test_cuda_sim.py and
tests/test_cuda_gallery.py; PTX in tests/test_cuda_ptx.py)."""
from kadj import adj_ir as A
from kadj.cuda.guard_hoist import hoist_guards


def _fn(body, params=("i", "u", "n")):
    return A.Function("k", params, "", body=body)


def _top_assigns(fn):
    return [x.target for x in fn.body if isinstance(x, A.Assign)]


def _chain():
    # t1 = 0 < i; if t1: t2 = i < u.shape[0] - 1; if t2: x = u[i]
    return [A.Assign("t1", "0 < i"),
            A.If("t1", then=[A.Comment("# a guard"),
                             A.Assign("t2", "bool(i < u.shape[0] - 1)"),
                             A.If("t2", then=[A.Assign("x", "u[i]")])]),
            A.If("t1", then=[A.If("t2", then=[A.Call("use(x)")])])]


def test_a_guard_chain_moves_out():
    fn = hoist_guards(_fn(_chain()))
    assert _top_assigns(fn) == ["t1", "t2"]
    # the element load stays under both guards
    outer = [x for x in fn.body if isinstance(x, A.If)][0]
    inner = [x for x in outer.then if isinstance(x, A.If)][0]
    assert [x.target for x in inner.then] == ["x"]


def test_a_value_read_outside_its_branch_stays():
    body = _chain() + [A.Call("use(t2)")]      # t2 read where t1 may be false
    fn = hoist_guards(_fn(body))
    assert _top_assigns(fn) == ["t1"]


def test_values_that_may_fail_or_load_stay():
    for value in ("i // n < 3", "u[i] < 0", "i % n == 0", "f(i) < 1", "i / n < 1.0",
                  "i < 1.5"):
        body = [A.Assign("t1", "0 < i"),
                A.If("t1", then=[A.Assign("t2", value),
                                 A.If("t2", then=[A.Call("use()")])])]
        fn = hoist_guards(_fn(body))
        assert _top_assigns(fn) == ["t1"], value


def test_an_operand_assigned_only_in_another_branch_stays():
    body = [A.Assign("t1", "0 < i"),
            A.If("n", then=[A.Assign("m", "n - 1")]),
            A.If("t1", then=[A.Assign("t2", "i < m"),
                             A.If("t2", then=[A.Call("use()")])])]
    fn = hoist_guards(_fn(body))
    assert _top_assigns(fn) == ["t1"]


def test_only_leading_assignments_of_a_branch_without_else_move():
    body = [A.Assign("t1", "0 < i"),
            A.If("t1", then=[A.Call("side()"), A.Assign("t2", "i < n"),
                             A.If("t2", then=[A.Call("use()")])]),
            A.If("t1", then=[A.Assign("t3", "i < n"),
                             A.If("t3", then=[A.Call("use()")])],
                 orelse=[A.Call("other()")])]
    fn = hoist_guards(_fn(body))
    assert _top_assigns(fn) == ["t1"]
