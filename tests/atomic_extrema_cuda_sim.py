"""cuda.atomic.max/min in differentiated CUDA kernels, in the simulator (run by
tests/test_cuda_atomic_extrema.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before
numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/atomic_extrema_cuda_sim.py max_pool [case ...]

Each case checks ``k.adjoint`` against float64 central differences of forward launches
(:func:`kadj.testing.check_grad_cuda`); the values are distinct (a tie's finite
differences are one-sided).  ``exact:<kernel>`` compares the adjoint with the
analytic one: the cotangent of each element goes to the winning value, or stays on
the element when its pre-call value won.  ``tape:<kernel>`` records the launch on a
:class:`kadj.Tape` (host and device arrays) and compares ``tape.grad`` with the direct
adjoint.  Prints ``CASE <name> OK <detail>`` or
``CASE <name> FAIL <why>``.
"""
import os
import sys

import numpy as np
from numba import cuda

import kadj

K = 4


@kadj.differentiate
@cuda.jit
def max_pool(x, out):
    """Max pooling by windows of K: one atomic.max per thread."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.max(out, i // K, x[i] * x[i] + x[i])


@kadj.differentiate
@cuda.jit
def max_all(x, out, scale):
    """The maximum of all elements (scaled), over a pre-call floor out[0]."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.max(out, 0, scale * math_sin(x[i]))


@cuda.jit(device=True)
def math_sin(v):
    return v - v * v * v / 6.0


@kadj.differentiate
@cuda.jit
def min_pool_2d(x, out):
    """Minimum of each row of a 2-D array (cuda.grid(2)), atomic.min."""
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        cuda.atomic.min(out, i, 2.0 * x[i, j] - x[i, j] * x[i, j])


def _pool_args(r):
    x = r.permutation(np.linspace(-2.0, 2.0, 16))     # distinct values
    out = np.full(4, -10.0)
    out[2] = 50.0                                     # this window keeps its floor
    return [x, out]


def _all_args(r):
    return [r.permutation(np.linspace(-1.0, 1.0, 24)), np.array([0.1]), 1.5]


def _min_args(r):
    x = r.permutation(np.linspace(1.2, 3.0, 15)).reshape(3, 5)   # 2x - x^2 decreasing
    out = np.array([10.0, -50.0, 10.0])              # row 1 keeps its floor
    return [x, out]


@kadj.differentiate
@cuda.jit
def scatter_max(x, bins, out):
    """A per-thread loop: each thread scatters NB scaled values into bins (atomic.max
    in a loop, the contributions numbered per thread)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        for k in range(bins.shape[1]):
            cuda.atomic.max(out, bins[i, k], x[i] * x[i] * (k + 1.0) - k * x[i])


@kadj.differentiate
@cuda.jit
def stride_min(x, w, out):
    """A grid-stride loop over all elements: out[j % M] = min over j of w * x[j]^3."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    j = i
    while j < x.shape[0]:
        cuda.atomic.min(out, j % out.shape[0], w[0] * x[j] * x[j] * x[j])
        j += stride


@kadj.differentiate
@cuda.jit
def two_sites(x, out):
    """Two calls on one array: the largest and the largest doubled negative value."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.max(out, 0, x[i] + 0.5 * x[i] * x[i])
        cuda.atomic.max(out, 1, -2.0 * x[i])


def _scatter_args(r, n=12, nb=3, m=5):
    x = r.permutation(np.linspace(0.3, 2.0, n))       # distinct positive values
    bins = r.integers(0, m, size=(n, nb))
    out = np.full(m, -1.0)
    out[m - 1] = 40.0                                  # this bin keeps its floor
    return [x, bins, out]


def _stride_args(r, n=37, m=6):
    x = r.permutation(np.linspace(-1.5, 1.5, n))
    return [x, np.array([1.3]), np.full(m, 0.5)]


def _two_args(r):
    return [r.permutation(np.linspace(-2.0, 1.0, 10)), np.array([-9.0, -9.0])]


CASES = {
    "max_pool": (max_pool, (2, 8), _pool_args),
    "max_all": (max_all, (3, 8), _all_args),
    "min_pool_2d": (min_pool_2d, ((1, 2), (4, 4)), _min_args),
    "scatter_max": (scatter_max, (2, 8), _scatter_args),
    "stride_min_2x4": (stride_min, (2, 4), _stride_args),
    "stride_min_1x32": (stride_min, (1, 32), _stride_args),
    "stride_min_3x16": (stride_min, (3, 16), _stride_args),
    "two_sites": (two_sites, (2, 8), _two_args),
}


def _exact_max_pool(rng):
    """The adjoint of max_pool against the analytic cotangent routing."""
    x, out = _pool_args(rng)
    ct = rng.standard_normal(4)
    adj_x, adj_out = np.zeros_like(x), ct.copy()
    max_pool.adjoint[(2,), (8,)](x.copy(), out.copy(), adj_x, adj_out)
    ref_x, ref_out = np.zeros_like(x), ct.copy()
    v = x * x + x
    for j in range(4):
        w = v[j * K:(j + 1) * K]
        if out[j] >= w.max():
            continue
        m = j * K + int(np.argmax(w))
        ref_x[m], ref_out[j] = ct[j] * (2 * x[m] + 1), 0.0
    assert np.allclose(adj_x, ref_x) and np.allclose(adj_out, ref_out), \
        (adj_x, ref_x, adj_out, ref_out)
    return float(np.max(np.abs(adj_x - ref_x)))


def _ties(rng):
    """Equal values: the cotangent goes to one of them only (the lowest thread), and
    not at all when the pre-call value equals the maximum."""
    x = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 3.0, 1.0])
    out = np.array([-1.0, 12.0])      # window 1: the floor equals the maximum
    adj_x, adj_out = np.zeros(8), np.array([2.0, 5.0])
    max_pool.adjoint[(1,), (8,)](x.copy(), out.copy(), adj_x, adj_out)
    v = x * x + x
    want = np.zeros(8)
    want[1] = 2.0 * (2 * x[1] + 1)     # window 0: lanes 1 and 2 tie, lane 1 wins
    assert v[1] == v[2] and np.allclose(adj_x, want), adj_x
    assert np.allclose(adj_out, [0.0, 5.0]), adj_out   # window 1: the floor won
    return 0.0


def _winners(out, contributions, op):
    """{element: index of the winning contribution, or None when the pre-call value
    won} of an atomic ``op`` ("max"/"min") whose ``contributions`` (element, value)
    are listed in (thread, number) order: the pre-call value when it equals the
    result, else the first contribution equal to it."""
    final = out.copy()
    pick = max if op == "max" else min
    for e, v in contributions:
        final[e] = pick(final[e], v)
    won = {}
    for e in {e for e, _ in contributions}:
        won[e] = None if out[e] == final[e] else next(
            n for n, c in enumerate(contributions) if c == (e, final[e]))
    return won


def _scatter_value(x, k):
    return x * x * (k + 1.0) - k * x


def _exact_scatter(rng, config=((2,), (8,)), args=None):
    """scatter_max's adjoint against the analytic routing (:func:`_winners`: threads
    in index order, each thread's iterations in order); the forward arguments are left
    unchanged."""
    x, bins, out = args or _scatter_args(rng)
    ct = rng.standard_normal(out.shape[0])
    given = [x.copy(), bins.copy(), out.copy()]
    adj_x, adj_out = np.zeros_like(x), ct.copy()
    scatter_max.adjoint[config](*given, adj_x, adj_out)
    assert all(np.array_equal(a, b) for a, b in zip(given, [x, bins, out])), \
        "the adjoint launch changed the forward arguments"
    who = [(i, k) for i in range(x.shape[0]) for k in range(bins.shape[1])]
    won = _winners(out, [(bins[i, k], _scatter_value(x[i], k)) for i, k in who], "max")
    ref_x, ref_out = np.zeros_like(x), ct.copy()
    for e, n in won.items():
        if n is not None:
            i, k = who[n]
            ref_x[i] += ct[e] * (2 * x[i] * (k + 1.0) - k)
            ref_out[e] = 0.0
    assert np.allclose(adj_x, ref_x) and np.allclose(adj_out, ref_out), \
        (adj_x, ref_x, adj_out, ref_out)
    return float(np.max(np.abs(adj_x - ref_x)))


def _ties_in_loop(rng):
    """Ties inside a loop (value x^2 (k + 1) - k x, derivative 2 x (k + 1) - k):

    - bin 0: thread 0 (x = 1) gives 1 at k = 0 and at k = 1: k = 0 wins (d = 2);
    - bin 1: thread 1 (x = .5, k = 1) and thread 2 (x = 0, k = 0) both give 0: thread 1
      wins (d = 1), though thread 2 gives it at a lower k;
    - bin 2: thread 2 (k = 1) gives 0, equal to the pre-call value: the pre-call wins;
    - bin 3: thread 1 (k = 0) gives .25 (d = 1); bin 4: thread 3 (x = 2) gives 4 then
      6: k = 1 wins (d = 7).
    """
    x = np.array([1.0, 0.5, 0.0, 2.0])
    bins = np.array([[0, 0], [3, 1], [1, 2], [4, 4]])
    out = np.array([-1.0, -1.0, 0.0, -1.0, -1.0])
    ct = np.arange(1.0, 6.0)
    adj_x, adj_out = np.zeros(4), ct.copy()
    scatter_max.adjoint[(1,), (4,)](x.copy(), bins.copy(), out.copy(), adj_x, adj_out)
    assert np.allclose(adj_out, [0.0, 0.0, 3.0, 0.0, 0.0]), adj_out
    assert np.allclose(adj_x, [2.0, 2.0 + 4.0, 0.0, 35.0]), adj_x
    return _exact_scatter(rng, ((1,), (4,)), [x, bins, out])


def _exact_stride(rng):
    """stride_min (a while loop) against the analytic routing on two launch shapes,
    with ties between two threads, two iterations of one thread and the pre-call
    value."""
    worst = 0.0
    for config, same_thread in ((((2,), (4,)), 27), (((1,), (5,)), 33)):
        x, w, out = _stride_args(rng)
        m, nthreads = out.shape[0], config[0][0] * config[1][0]
        x[3] = x[9] = x[same_thread] = -1.5    # 3, 9: two threads; 3 and same_thread:
        # one thread; bin 5: the pre-call value ties with the smallest contribution
        out[5] = min(w[0] * x[j] * x[j] * x[j] for j in range(5, x.shape[0], m))
        ct = rng.standard_normal(m)
        adj = [np.zeros_like(x), np.zeros(1), ct.copy()]
        stride_min.adjoint[config](x.copy(), w.copy(), out.copy(), *adj)
        order = [j for t in range(nthreads) for j in range(t, x.shape[0], nthreads)]
        won = _winners(out, [(j % m, w[0] * x[j] * x[j] * x[j]) for j in order], "min")
        tied = [j for j in order if j % m == 3 and x[j] == -1.5]
        assert won[5] is None and len(tied) >= 3 and order[won[3]] == tied[0], won
        ref_x, ref_w, ref_out = np.zeros_like(x), 0.0, ct.copy()
        for e, n in won.items():
            if n is not None:
                j = order[n]
                ref_x[j] += ct[e] * 3 * w[0] * x[j] ** 2
                ref_w += ct[e] * x[j] ** 3
                ref_out[e] = 0.0
        assert np.allclose(adj[0], ref_x) and np.allclose(adj[2], ref_out) and \
            np.isclose(adj[1][0], ref_w), (config, adj, ref_x, ref_out, ref_w)
        worst = max(worst, float(np.max(np.abs(adj[0] - ref_x))))
    return worst


def _too_many_threads(rng):
    """A launch of 2**31 threads is refused (a numbered key is thread * 2**32 +
    number), before anything runs."""
    args = _scatter_args(rng)
    try:
        scatter_max.adjoint[(1 << 21,), (1024,)](*args, np.zeros(12), np.zeros(5))
    except kadj.DifferentiationError as exc:
        assert "2**31 threads or more" in str(exc), exc
        return 0.0
    raise AssertionError("not refused")


EXTRA = {"exact:max_pool": _exact_max_pool, "ties": _ties,
         "too_many_threads": _too_many_threads,
         "exact:scatter_max": _exact_scatter, "ties_in_loop": _ties_in_loop,
         "exact:stride_min": _exact_stride}


def _on_a_tape(name):
    """The launch recorded on a kadj.Tape (host arrays, and device arrays): tape.grad
    equals the direct adjoint, which the gradient cases check.  The tape must keep
    the claimed array's pre-call contents: the adjoint compares the contributions
    with them (it kept none, and the pre-call value won every element)."""
    k, config, make = CASES[name]
    rng = np.random.default_rng(5)
    args = make(rng)
    plan = k.adjoint_plan(*args)
    cts = {i: rng.standard_normal(args[i].shape) for i in plan.written}
    bufs = [cts[i].copy() if i in cts else
            np.zeros_like(args[i]) if isinstance(args[i], np.ndarray) else
            np.zeros(1) for i in plan.adjoint_args]
    k.adjoint[config](*[np.copy(a) if isinstance(a, np.ndarray) else a for a in args],
                      *bufs)
    worst = 0.0
    for device in (False, True):
        put = cuda.to_device if device else np.copy
        run = [put(a) if isinstance(a, np.ndarray) else a for a in args]
        with kadj.Tape() as tape:
            k[config](*run)
        tape.backward(seeds=[(run[i], put(cts[i])) for i in plan.written])
        for j, i in enumerate(plan.adjoint_args):
            if not isinstance(args[i], np.ndarray):
                continue
            g = tape.grad(run[i])
            g = g.copy_to_host() if device else g
            assert np.allclose(g, bufs[j], rtol=1e-12, atol=1e-14), \
                (plan.arg_names[i], device, g, bufs[j])
            worst = max(worst, float(np.max(np.abs(g - bufs[j]), initial=0.0)))
    return worst


def run_case(name):
    from kadj.testing import check_grad_cuda
    rng = np.random.default_rng(0)
    if name.startswith("tape:"):
        return _on_a_tape(name[len("tape:"):])
    if name in EXTRA:
        return EXTRA[name](rng)
    k, config, make = CASES[name]
    return check_grad_cuda(k, config, make(rng)).max_rel_error


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    from cudatools import report_cases
    cases = {n: (lambda n=n: run_case(n))
             for n in list(CASES) + list(EXTRA) + [f"tape:{c}" for c in CASES]}
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
