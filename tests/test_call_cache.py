"""The per-signature facts of repeated ``k.adjoint(...)`` calls (kadj/call_cache.py)
never outlive what they stand for: a call after an accepted one of the same signature
is refused when its values are bad (shapes, aliasing, overlapping views, read-only or
self-overlapping buffers), and a call with a new dtype, layout or rule table gets the
adjoint for it.  Gradients against the analytic adjoint of ``v = alpha * u**2``;
refused calls leave every array as it was."""
import numpy as np
import pytest
from numba import njit
from numpy.lib.stride_tricks import as_strided

import kadj
from kadj import call_cache, rules, validate

N = 5


@njit
def square(u, v, alpha):
    for i in range(u.shape[0]):
        v[i] = alpha * u[i] * u[i]


@pytest.fixture(scope="module")
def k():
    return kadj.differentiate(square)


def reference(u, alpha, ct_v):
    """(adj_u, adj_v, adj_alpha) on return for zero adj_u, adj_alpha and ``ct_v``: v is
    overwritten, so its adjoint before the call is zero."""
    return 2.0 * alpha * u * ct_v, np.zeros_like(ct_v), float(np.sum(u * u * ct_v))


def run_checked(k, u, v, alpha, adj_u, adj_v, adj_a, rtol=1e-12):
    """Run the adjoint with ``adj_v`` as seed and compare with :func:`reference`."""
    ct = adj_v.copy()
    adj_u[...] = 0.0
    adj_a[...] = 0.0
    k.adjoint(u, v, alpha, adj_u, adj_v, adj_a)
    want_u, want_v, want_a = reference(u.astype(np.float64), alpha, ct.astype(np.float64))
    np.testing.assert_allclose(adj_u, want_u, rtol=rtol, atol=0)
    np.testing.assert_allclose(adj_v, want_v, atol=0)
    np.testing.assert_allclose(adj_a[0], want_a, rtol=rtol)


def refused(exc, match, k, args):
    """``k.adjoint(*args)`` raises ``exc`` matching ``match`` and changes no array."""
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    with pytest.raises(exc, match=match):
        k.adjoint(*args)
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg="a refused call changed an array")


def fresh(n=N, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(n).astype(dtype)
    return (u, np.zeros(n, dtype), 0.7, np.zeros(n, dtype), rng.standard_normal(n)
            .astype(dtype), np.zeros(1))    # alpha is a Python float: float64


def same_signature(a, b):
    key = call_cache.signature(a)
    assert key is not None and key == call_cache.signature(b), \
        "the test meant both calls to share one signature"


# ---- the cache is used, and only where it may be -----------------------------------------
def test_repeated_calls_skip_the_full_checks_until_a_value_changes(k, monkeypatch):
    calls = []
    full = validate.check_adjoint_call
    monkeypatch.setattr(validate, "check_adjoint_call",
                        lambda *a, **kw: (calls.append(1), full(*a, **kw))[1])
    args = fresh()
    run_checked(k, *args)
    first = len(calls)
    for seed in range(3):
        run_checked(k, *fresh(seed=seed + 1))
    assert len(calls) == first, "repeated calls of one signature ran the full checks"
    u, v, a, au, av, aa = fresh()
    refused(ValueError, "must have the shape and dtype of u", k,
            (u, v, a, np.zeros(N + 1), av, aa))
    assert len(calls) == first + 1, "a changed shape did not go through the full checks"


def test_signature_tells_apart_what_numba_types_differently():
    x = np.zeros(4)
    ro = np.zeros(4)
    ro.flags.writeable = False
    keys = [call_cache.signature((a,)) for a in
            (x, x.astype(np.float32), x.astype(">f8"), ro, x[::2], x.reshape(2, 2),
             x.reshape(2, 2).T, 1.0, 1, np.float32(1.0), True)]
    assert None not in keys and len(set(keys)) == len(keys), keys
    for odd in ([1.0], None, 2 ** 63, -2 ** 63 - 1, x.view(np.matrix), (x, x)):
        assert call_cache.signature((x, odd)) is None, odd


# ---- a new dtype, layout or rule gets its own adjoint ------------------------------------
def test_dtype_change_between_calls(k):
    run_checked(k, *fresh())
    run_checked(k, *fresh(dtype=np.float32), rtol=1e-5)
    run_checked(k, *fresh(seed=4))
    u, v, a, au, av, aa = fresh()
    refused(ValueError, "must have the shape and dtype of u", k,
            (u, v, a, au.astype(np.float32), av, aa))
    refused(ValueError, "1-element array of dtype float64", k,
            (u, v, a, au, av, aa.astype(np.float32)))


def test_layout_change_between_calls(k):
    run_checked(k, *fresh())
    u, v, a, au, av, aa = fresh(2 * N)
    strided = (u[::2], v[::2], a, np.zeros(2 * N)[::2], av[::2], aa)
    run_checked(k, *strided)                        # non-contiguous arrays and buffers
    run_checked(k, *(u[1::2], v[1::2], a, np.zeros(2 * N)[1::2], av[1::2], aa))
    zero_stride = as_strided(np.zeros(1), (N,), (0,))  # writeable, one element N times
    bad = (u[::2], v[::2], a, zero_stride, av[::2], aa)
    refused(ValueError, "several elements of adj_u share memory", k, bad)
    bad = (u[::2], as_strided(np.zeros(1), (N,), (0,)), a, np.zeros(2 * N)[::2],
           av[::2], aa)
    refused(ValueError, "'v' is written by the kernel but several of its elements", k,
            bad)


def test_rule_replaced_between_calls():
    @njit
    def f(x):
        return x * x

    @njit
    def uses_f(u, v):
        for i in range(u.shape[0]):
            v[i] = f(u[i])

    kern = kadj.differentiate(uses_f)
    u = np.linspace(0.5, 1.5, N)
    try:
        for scale in (1.0, 3.0):
            @kadj.register_adjoint(f)
            def _(g, out, x, scale=scale):   # deliberately scaled rule
                return (g * scale * 2.0 * x,)

            for _repeat in range(2):
                au, av = np.zeros(N), np.ones(N)
                kern.adjoint(u, np.zeros(N), au, av)
                np.testing.assert_allclose(au, scale * 2.0 * u, rtol=1e-14,
                                           err_msg=f"rule scaled by {scale}")
    finally:
        rules.unregister(f)


# ---- bad values after an accepted call of the same signature -----------------------------
def test_shapes_after_an_accepted_call(k):
    run_checked(k, *fresh())
    u, v, a, au, av, aa = fresh()
    refused(ValueError, "must have the shape and dtype of v", k,
            (u, v, a, au, np.zeros(N - 1), aa))
    refused(ValueError, r"must be\s+a 1-element array", k, (u, v, a, au, av, np.zeros(2)))
    refused(ValueError, "must have the shape and dtype of u", k,
            (u, v, a, np.zeros(N + 2), av, aa))


def test_read_only_buffer_after_a_writeable_one(k):
    run_checked(k, *fresh())
    u, v, a, au, av, aa = fresh()
    au.flags.writeable = False
    refused(ValueError, "adj_u is read-only", k, (u, v, a, au, av, aa))


def test_aliasing_after_a_clean_call_of_owning_arrays(k):
    u, v, a, au, av, aa = fresh()
    run_checked(k, u, v, a, au, av, aa)
    for bad, match in [((u, v, a, u, av, aa), "adj_u shares memory with the forward "
                                              "argument 'u'"),
                       ((u, v, a, au, au, aa), "adj_u and adj_v share memory"),
                       ((u, v, a, au, v, aa), "adj_v shares memory with the forward "
                                              "argument 'v'"),
                       ((u, u, a, au, av, aa), "'u' overlaps 'v'")]:
        same_signature((u, v, a, au, av, aa), bad)
        refused(ValueError, match, k, bad)


def test_views_of_one_array_after_a_clean_call(k):
    # rows of one history array: disjoint views of one allocation are accepted
    hist = np.random.default_rng(1).standard_normal((4, N))
    grads = np.zeros((3, N))
    seed = np.random.default_rng(2).standard_normal((3, N))
    aa = np.zeros((2, 1))[0]
    clean = (hist[0], hist[1], 0.3, grads[0], seed[0], aa)
    run_checked(k, *clean)
    run_checked(k, hist[2], hist[3], 0.3, grads[1], seed[1], aa)
    flat = np.zeros(3 * N)
    cases = [
        ((hist[0], hist[0], 0.3, grads[0], seed[0], aa), "'u' overlaps 'v'"),
        ((hist[1], hist[2], 0.3, hist[1], seed[0], aa),
         "adj_u shares memory with the forward argument 'u'"),
        ((hist[1], hist[2], 0.3, grads[0], grads[0], aa), "adj_u and adj_v share memory"),
        ((hist[1], hist[2], 0.3, flat[:N], flat[N - 1:2 * N - 1], aa),
         "adj_u and adj_v share memory"),          # overlapping slices, different starts
        ((hist[1], hist[2], 0.3, grads[0], seed[0], hist[1][:1]),
         "adj_alpha shares memory with the forward argument 'u'"),
    ]
    hist_flat = hist.reshape(-1)
    cases.append(((hist_flat[0:N], hist_flat[2:N + 2], 0.3, grads[0], seed[0], aa),
                  "'u' overlaps 'v'"))
    for bad, match in cases:
        same_signature(clean, bad)
        refused(ValueError, match, k, bad)
    run_checked(k, hist[0], hist[1], 0.3, grads[2], seed[2], aa)


def test_untraceable_owner_after_a_clean_call(k):
    # as_strided views have no NumPy owner to trace: their bounds are tested
    u, v, a, au, av, aa = fresh()
    alias = as_strided(v, v.shape, v.strides)
    clean = (u, v, a, as_strided(au, au.shape, au.strides), av, aa)
    run_checked(k, *clean)
    bad = (u, v, a, alias, av, aa)
    same_signature(clean, bad)
    refused(ValueError, "adj_u shares memory with the forward argument 'v'", k, bad)


def test_empty_arrays_after_full_ones(k):
    run_checked(k, *fresh())
    u, v, a, au, av, aa = fresh(0)
    k.adjoint(u, v, a, au, av, aa)                   # nothing to do, nothing refused
    assert aa[0] == 0.0
    same = np.zeros(0)
    k.adjoint(u, v, a, same, same, aa)               # empty arrays share no element
    run_checked(k, *fresh(seed=5))
