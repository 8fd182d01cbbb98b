"""Sums that adjoint accumulations share, computed once (kadj/shared_factors.py): where
they are found and where not, the exact preparatory steps on hand-built adjoint IR,
and gradients against float64 finite differences and against the adjoint as it was
(bit for bit where only exact steps apply, to rounding where a factor is taken out)."""
import numpy as np
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj.shared_factors import (join_same_condition_ifs, merge_scalar_sums,
                                 share_factors)
from kadj.testing import check_grad
from kernels.cpu import GALLERY
from kernels.cpu.physics import nbody_accel, nbody_accel_sized


@njit
def scaled_components(m, d, s, out):
    """out[i, c] = m[i] * d[i, c] * s[i]: both m's and s's adjoints are a factor
    times one sum over the components."""
    for i in range(m.shape[0]):
        out[i, 0] = m[i] * d[i, 0] * s[i]
        out[i, 1] = m[i] * d[i, 1] * s[i]
        out[i, 2] = m[i] * d[i, 2] * s[i]


@njit
def scaled_components_f32(m, d, s, out):
    for i in range(m.shape[0]):
        out[i, 0] = m[i] * d[i, 0] * s[i]
        out[i, 1] = m[i] * d[i, 1] * s[i]


@njit
def one_sum(m, d, out):
    """Only one accumulation with a common factor: nothing shared, nothing taken out."""
    for i in range(m.shape[0]):
        out[i] = m[i] * d[i, 0] + m[i] * d[i, 1]


def _args(rng, n=7, dtype=np.float64):
    return (rng.uniform(0.5, 1.5, n).astype(dtype), rng.standard_normal((n, 3)).astype(dtype),
            rng.uniform(0.5, 1.5, n).astype(dtype), np.zeros((n, 3), dtype))


def test_nbody_adjoint_computes_the_shared_sum_once_and_is_right():
    args = nbody_accel_sized(np.random.default_rng(0), 30)
    k = kadj.differentiate(nbody_accel)
    src = k.adjoint_source(*args)
    assert "_shared1 = adj_az * dz + adj_ay * dy + adj_ax * dx" in src
    assert "adj_mass[j] += inv_r3 * _shared1" in src
    assert "# the sum adj_inv_r3 and adj_mass[j] share" in src
    check_grad(k, args)


def test_components_share_one_sum_and_the_gradient_is_right():
    args = _args(np.random.default_rng(1))
    k = kadj.differentiate(scaled_components)
    src = k.adjoint_source(*args)
    assert src.count("_shared1") == 3, src        # computed once, read twice
    check_grad(k, args)


def test_factored_adjoint_agrees_with_the_unfactored_one_to_rounding(monkeypatch):
    args = _args(np.random.default_rng(2), n=500)
    k = kadj.differentiate(scaled_components)
    assert "_shared1 =" in k.adjoint_source(*args)
    seeds = np.random.default_rng(3).standard_normal((500, 3))
    got = _run(k, args, seeds)
    plain = _unfactored(scaled_components, args, monkeypatch)
    assert "_shared1 =" not in plain
    want = _run_source(plain, args, seeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-13)


def _run(k, args, seeds):
    adj = [np.zeros_like(args[0]), np.zeros_like(args[1]), np.zeros_like(args[2]),
           seeds.copy()]
    k.adjoint(*[a.copy() for a in args], *adj)
    return adj


def _unfactored(kernel, args, monkeypatch):
    """The adjoint's source generated with only the exact steps (no disk cache)."""
    import kadj.targets.cpu as cpu
    saved = cpu.share_factors
    monkeypatch.setattr(cpu, "share_factors", lambda fn, factor=True: saved(fn, False))
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    return kadj.differentiate(njit(kernel.py_func)).adjoint_source(*args)


def _run_source(src, args, seeds):
    """The adjoint ``src`` run as Python."""
    ns = {}
    exec(compile(src, "<unfactored>", "exec"), ns)
    fn = next(v for k, v in ns.items() if k.endswith("_adjoint"))
    adj = [np.zeros_like(args[0]), np.zeros_like(args[1]), np.zeros_like(args[2]),
           seeds.copy()]
    fn(*[a.copy() for a in args], *adj)
    return adj


def test_float32_adjoint_keeps_its_products():
    args = _args(np.random.default_rng(4), dtype=np.float32)
    args = (args[0], args[1][:, :2].copy(), args[2], args[3][:, :2].copy())
    src = kadj.differentiate(scaled_components_f32).adjoint_source(*args)
    assert "_shared1 =" not in src
    check_grad(kadj.differentiate(scaled_components_f32), args)


def test_a_sum_no_other_accumulation_shares_is_left_as_written():
    rng = np.random.default_rng(5)
    args = (rng.standard_normal(6), rng.standard_normal((6, 2)), np.zeros(6))
    src = kadj.differentiate(one_sum).adjoint_source(*args)
    assert "_shared1 =" not in src
    check_grad(kadj.differentiate(one_sum), args)


# ---- the steps on hand-built adjoint IR ----------------------------------------------
def _fn(body, params=("a", "b", "c", "x", "y")):
    return A.Function(name="f", params=params, doc="", body=body)


def _acc(name, op, value):
    return A.Accumulate(A.AdjVar(var=name, name=name), op, value, how="plain")


def _elem(base, index, op, value):
    return A.Accumulate(A.AdjElem(array=base, index=(), base=base, index_texts=(index,)),
                        op, value, how="plain")


def test_a_scalar_sum_merges_into_its_last_contribution():
    body = [_acc("adj_v", "=", "a * x"), A.Assign("t", "b * y"),
            _acc("adj_v", "+=", "c * t")]
    fn = _fn(body)
    merge_scalar_sums(fn)
    assert [type(x).__name__ for x in fn.body] == ["Assign", "Accumulate"]
    assert fn.body[1].op == "=" and fn.body[1].value == "a * x + c * t"


def test_a_read_or_a_changed_operand_in_between_stops_the_merge():
    read = [_acc("adj_v", "=", "a * x"), A.Assign("t", "adj_v * 2.0"),
            _acc("adj_v", "+=", "c")]
    changed = [_acc("adj_v", "=", "a * x"), A.Assign("x", "b"), _acc("adj_v", "+=", "c")]
    for body in (read, changed):
        fn = _fn(list(body))
        merge_scalar_sums(fn)
        assert len(fn.body) == 3 and fn.body[2].op == "+="


def test_a_negated_contribution_is_subtracted():
    fn = _fn([_acc("adj_v", "=", "a"), _acc("adj_v", "+=", "-(b * c)")])
    merge_scalar_sums(fn)
    assert fn.body[0].value == "a - b * c"


def test_adjacent_ifs_on_one_condition_join_unless_the_first_writes_it():
    fn = _fn([A.If("not t2", then=[A.Assign("u", "a")]),
              A.If("not t2", then=[_acc("adj_u", "=", "b")])])
    join_same_condition_ifs(fn)
    assert len(fn.body) == 1 and len(fn.body[0].then) == 2
    fn = _fn([A.If("not t2", then=[A.Assign("t2", "a > b")]),
              A.If("not t2", then=[_acc("adj_u", "=", "b")])])
    join_same_condition_ifs(fn)
    assert len(fn.body) == 2


def test_shared_sum_is_not_hoisted_over_a_change_of_its_operands():
    def body(between):
        return [A.Assign("t1", "a * x"), _acc("adj_t", "=", "c * b"),
                _acc("adj_s", "=", "y * t1 + b * t1"),
                *between,
                _elem("adj_m", "i", "+=", "y * a * x + b * x * a")]
    fn = _fn(body([]))
    share_factors(fn)
    text = [getattr(x, "value", None) for x in fn.body]
    assert text.count("y + b") == 1 and text.count("a * x * _shared1") == 2, text
    fn = _fn(body([A.Assign("y", "c")]))          # y changes before the second sum
    share_factors(fn)
    assert not any(isinstance(x, A.Assign) and x.target.startswith("_shared")
                   for x in fn.body)


def test_gallery_gradients_where_sums_are_shared_or_merged():
    for name in ("nbody_accel", "bond_angles", "rk4_pendulum", "allen_cahn_reaction_parallel",
                 "logistic_loss", "to_polar", "huber_loss"):
        ex = next(e for e in GALLERY if e.name == name)
        check_grad(kadj.differentiate(ex.kernel, wrt=ex.wrt),
                   ex.make_args(np.random.default_rng(6)))


def test_a_factor_written_out_must_still_hold_where_the_sum_is():
    # t = m * d, with m an earlier name of the same load as m2; m changes before the
    # sums: t's product may not be written out with m there
    body = [A.Assign("m", "w[i]"), A.Assign("m2", "w[i]"), A.Assign("t", "m2 * d"),
            A.Assign("u", "m2 * e"), A.Assign("m", "c"),
            _acc("adj_s", "=", "a * t + b * u"),
            _elem("adj_w", "i", "+=", "a * d * m2 + b * e * m2")]
    fn = _fn(body, params=("w", "a", "b", "c", "d", "e", "i"))
    share_factors(fn)
    values = [getattr(x, "value", None) for x in fn.body]
    assert not any(isinstance(v, str) and v.startswith("m * ") for v in values), values
    # with m unchanged, the same statements share the sum, spelled with the first load
    body[4] = A.Assign("z", "c")
    fn = _fn(body, params=("w", "a", "b", "c", "d", "e", "i"))
    share_factors(fn)
    values = [getattr(x, "value", None) for x in fn.body]
    assert values.count("m * _shared1") == 2 and values.count("a * d + b * e") == 1, values


def test_no_merge_past_a_statement_that_may_leave_the_block():
    for leave in (A.Break(), A.If("c", then=[A.Continue()]), A.Return("None")):
        fn = _fn([_acc("adj_v", "=", "a * x"), leave, _acc("adj_v", "+=", "b")])
        merge_scalar_sums(fn)
        assert len(fn.body) == 3 and fn.body[0].value == "a * x", leave


def test_ifs_on_a_condition_reading_memory_the_first_writes_stay_apart():
    fn = _fn([A.If("x[i] > 0.0", then=[_elem("adj_y", "i", "+=", "a")]),
              A.If("x[i] > 0.0", then=[_acc("adj_u", "=", "b")])])
    join_same_condition_ifs(fn)
    assert len(fn.body) == 2


# ---- one name per element a block loads (kadj/reused_loads.py) ------------------------
def test_a_second_load_of_an_element_is_read_under_the_first_name():
    from kadj.reused_loads import reuse_loads
    body = [A.Assign("m1", "w[i]"), A.Assign("t", "m1 * a"), A.Assign("m2", "w[i]"),
            _acc("adj_s", "=", "m2 * b"), _elem("adj_w", "i", "+=", "adj_s * m2")]
    fn = _fn(body, params=("w", "a", "b", "i"))
    reuse_loads(fn)
    values = [x.value for x in fn.body]
    assert values == ["w[i]", "m1 * a", "m1 * b", "adj_s * m1"], values


def test_loads_stay_apart_where_the_element_or_the_first_name_may_change():
    from kadj.reused_loads import reuse_loads
    stored = [A.Assign("m1", "w[i]"), A.Assign("w[k]", "a"), A.Assign("m2", "w[i]"),
              _acc("adj_s", "=", "m2 * b")]
    index = [A.Assign("m1", "w[i]"), A.Assign("i", "k"), A.Assign("m2", "w[i]"),
             _acc("adj_s", "=", "m2 * b")]
    renamed = [A.Assign("m1", "w[i]"), A.Assign("m2", "w[i]"), A.Assign("m1", "a"),
               _acc("adj_s", "=", "m2 * b")]
    twice = [A.Assign("m1", "w[i]"), A.Assign("m2", "w[i]"), _acc("adj_s", "=", "m2 * b"),
             A.Assign("m2", "a")]
    for body in (stored, index, renamed, twice):
        fn = _fn(list(body), params=("w", "a", "b", "i", "k"))
        reuse_loads(fn)
        assert any(isinstance(x, A.Assign) and x.target == "m2" for x in fn.body), body
        assert fn.body[-2 if body is twice else -1].value == "m2 * b"


def test_a_load_read_outside_its_block_stays():
    from kadj.reused_loads import reuse_loads
    body = [A.If("c", then=[A.Assign("m1", "w[i]"), A.Assign("m2", "w[i]"),
                            A.Assign("t", "m2 * a")]),
            _acc("adj_s", "=", "m2 * b")]
    fn = _fn(body, params=("w", "a", "b", "i", "c"))
    reuse_loads(fn)
    assert [x.target for x in fn.body[0].then] == ["m1", "m2", "t"]


def test_a_sum_starting_with_one_term_twice_starts_with_it_doubled():
    from kadj.shared_factors import double_repeated_terms
    cases = {"a * x + a * x": "a * x * 2.0",
             "a * x + a * x + b * y": "a * x * 2.0 + b * y",
             "b * y + a * x + a * x": "b * y + a * x + a * x",     # not exact: kept
             "a * x + b * y": "a * x + b * y"}
    for before, after in cases.items():
        fn = _fn([_elem("adj_x", "i", "+=", before)])
        double_repeated_terms(fn)
        assert fn.body[0].value == after, before
    x = np.array([3.0, -0.0, 1e-310, 1e308, np.inf, 0.1])
    a = np.array([0.7, 2.0, 3.0, 1.5, 2.0, -0.3])
    with np.errstate(over="ignore"):                                # (1e308: both inf)
        np.testing.assert_array_equal(a * x + a * x, a * x * 2.0)  # the same numbers


def test_l2_norm_adjoint_doubles_its_one_load():
    ex = next(e for e in GALLERY if e.name == "l2_norm")
    args = ex.make_args(np.random.default_rng(7))
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    assert "adj_s * x_i * 2.0" in k.adjoint_source(*args)
    check_grad(k, args)
