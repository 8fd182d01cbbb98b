"""Checkpointing schedules: exact optimal counts, snapshot bounds, and the validator."""
import time
from functools import lru_cache
from math import comb

import pytest

from kadj import schedules as S
from kadj.schedules import ScheduleError, binomial, binomial_cost, simulate


def formula(n, s):
    t = 0
    while comb(s + t, s) < n:
        t += 1
    return t * n - comb(s + t, s + 1) + 1


@lru_cache(maxsize=None)
def recomputation_dp(length, c):
    """Griewank's recurrence, by brute force: forward executions needed to reverse
    ``length`` steps from the current state ``a`` (held) with ``c`` snapshots."""
    if length == 1:
        return 0
    if c == 1:
        return length * (length - 1) // 2
    return min(m + recomputation_dp(length - m, c - 1) + recomputation_dp(m, c)
               for m in range(1, length))


def test_formula_matches_brute_force_recurrence():
    for n in range(1, 31):
        for s in range(1, 6):
            assert formula(n, s) == recomputation_dp(n, s) + 1, (n, s)


@pytest.mark.parametrize("n,s,expected", [(10, 3, 16), (100, 5, 317), (1000, 10, 3637),
                                          (1000, 20, 2748), (10_000, 20, 37977)])
def test_binomial_examples(n, s, expected):
    assert binomial_cost(n, s) == expected
    result = simulate(binomial(n, s), n, s)
    assert result.forward_executions == expected
    assert result.peak_snapshots <= s


def test_binomial_every_small_case_is_optimal_and_bounded():
    for n in range(1, 65):
        for s in range(1, 9):
            sched = binomial(n, s)
            result = simulate(sched, n, s)
            assert result.forward_executions == formula(n, s), (n, s)
            assert result.peak_snapshots <= s, (n, s)
            assert result.reversed_steps == n
            # the forward sweep runs every step exactly once and ends with step n-1
            fwd = simulate_forward_executions(sched.forward)
            assert fwd == n, (n, s)


def simulate_forward_executions(actions):
    return sum(a[2] - a[1] if a[0] == "advance" else 1 if a[0] == "last" else 0
               for a in actions)


def test_binomial_edge_cases():
    assert simulate(binomial(1, 1), 1, 1).forward_executions == 1
    assert simulate(binomial(1, 1), 1, 1).peak_snapshots == 0
    assert list(binomial(1, 5)) == [("last", 0), ("reverse", 0)]
    assert simulate(binomial(2, 1), 2, 1).forward_executions == 2
    for s in range(1, 8):
        for n in range(1, s + 2):         # n <= s + 1: store every state, no recomputation
            r = simulate(binomial(n, s), n, s)
            assert r.forward_executions == n
            assert r.peak_snapshots == n - 1
    for n in range(1, 40):                # s = 1: t = n - 1
        assert binomial_cost(n, 1) == (n - 1) * n - comb(n, 2) + 1 == n * (n - 1) // 2 + 1
        assert simulate(binomial(n, 1), n, 1).forward_executions == n * (n - 1) // 2 + 1


def test_binomial_uses_all_snapshots_when_useful():
    # fewer snapshots would cost more, so the optimum must hold exactly s at peak
    r = simulate(binomial(1000, 10), 1000, 10)
    assert r.peak_snapshots == 10
    assert binomial_cost(1000, 9) > binomial_cost(1000, 10)


def test_binomial_is_fast():
    t0 = time.perf_counter()
    sched = binomial(10_000, 20)
    assert time.perf_counter() - t0 < 1.0
    assert len(sched) < 10 * 10_000


def test_argument_checks():
    for bad in [(0, 1), (5, 0), (2.0, 1), (True, 1)]:
        with pytest.raises(ValueError):
            binomial(*bad)
    with pytest.raises(ValueError):
        S.periodic(5, 0)


def test_store_all():
    for n in range(1, 20):
        sched = S.store_all(n)
        r = simulate(sched, n, max(1, n - 1))
        assert r.forward_executions == n
        assert r.peak_snapshots == n - 1


@pytest.mark.parametrize("every", [1, 2, 3, 5, 8])
def test_periodic(every):
    for n in range(1, 40):
        sched = S.periodic(n, every)
        r = simulate(sched, n, sched.snapshots)
        segments = [min(a + every, n) - a for a in range(0, n, every)]
        extra = sum(L - 1 for L in segments[:-1]) + max(0, segments[-1] - 2)
        assert r.forward_executions == n + extra, (n, every)
        assert r.peak_snapshots <= -(-n // every) + every - 2, (n, every)


def run_online(n, s):
    o = S.online(s)
    forward = []
    for _ in range(n):
        acts = o.step()
        assert acts[-1] == ("advance", o.n - 1, o.n)
        forward.extend(acts)
    sched = o.finish()
    assert sched.forward == tuple(forward)
    return sched


def test_online_schedules_are_valid_and_within_bound():
    for s in range(1, 11):
        c = s // 2 + 1                   # snapshots left free for the backward at least
        for n in list(range(1, 70)) + [200, 513, 1000]:
            sched = run_online(n, s)
            r = simulate(sched, n, s)
            # stated bound: n first-sweep executions plus an optimal reversal of the whole
            # loop with floor(s/2) + 1 snapshots
            assert r.forward_executions <= n + binomial_cost(n, c) - 1, (n, s)
            assert r.forward_executions >= binomial_cost(n, s)      # offline is optimal
            if n <= (s + 1) // 2:        # every state kept: no recomputation
                assert r.forward_executions == n


def test_online_near_binomial_for_long_loops():
    for n, s, ratio in [(1000, 10, 1.15), (1000, 20, 1.1), (10_000, 20, 1.2)]:
        r = simulate(run_online(n, s), n, s)
        assert r.forward_executions <= ratio * binomial_cost(n, s), (n, s, r)


def test_online_cannot_step_after_finish():
    o = S.online(3)
    o.step()
    o.finish()
    with pytest.raises(ScheduleError):
        o.step()
    with pytest.raises(ScheduleError):
        S.online(3).finish()


# --- the validator must catch broken schedules ---------------------------------------------

def mutated(actions, k, replacement):
    acts = list(actions)
    acts[k:k + 1] = replacement
    return acts


def test_simulate_rejects_broken_schedules():
    n, s = 10, 3
    good = list(binomial(n, s))
    simulate(good, n, s)
    rev = [k for k, a in enumerate(good) if a[0] == "reverse"]
    restores = [k for k, a in enumerate(good) if a[0] == "restore"]
    stores = [k for k, a in enumerate(good) if a[0] == "store"]
    advances = [k for k, a in enumerate(good) if a[0] == "advance"]
    broken = {
        "missing reversal": mutated(good, rev[3], []),
        "reversed twice": mutated(good, rev[3], [good[rev[3]], good[rev[3]]]),
        "out of order": good[:rev[0]] + [good[rev[1]]] + good[rev[0] + 1:],
        "restore dropped": mutated(good, restores[0], []),
        "store dropped": mutated(good, stores[1], []),
        "short advance": mutated(good, advances[-1], [("advance", good[advances[-1]][1],
                                                        good[advances[-1]][2] - 1)]),
        "reverse before forward": [("store", 0), ("reverse", 0)],
        "no last": [a for a in good if a[0] != "last"],
        "unknown": mutated(good, 0, [("jump", 3)]),
        "restore unknown": good[:-1] + [("restore", 7)],
    }
    for name, acts in broken.items():
        with pytest.raises(ScheduleError):
            simulate(acts, n, s)
            pytest.fail(name)
    with pytest.raises(ScheduleError, match="more than 2"):
        simulate(good, n, 2)


# --- cross-check with the checkpoint_schedules package -------------------------------------

def translate(cs_schedule, n):
    """checkpoint_schedules' actions in kadj's model: there every reversed step is first
    re-run forward to store its adjoint dependencies; in kadj the adjoint recomputes
    that itself, so that run is dropped (except for the first sweep's run of step n-1)."""
    import checkpoint_schedules as cs
    out, current = [], 0
    for a in cs_schedule:
        if isinstance(a, cs.Forward):
            if a.write_ics:
                out.append(("store", a.n0))
            if a.write_adj_deps:
                assert a.n1 == a.n0 + 1
                if a.n0 > current:
                    out.append(("advance", current, a.n0))
                if a.n0 == n - 1 and not any(x[0] == "last" for x in out):
                    out.append(("last", a.n0))
            else:
                out.append(("advance", a.n0, a.n1))
            current = a.n1
        elif isinstance(a, cs.Reverse):
            assert a.n0 == a.n1 - 1
            out.append(("reverse", a.n0))
        elif isinstance(a, (cs.Copy, cs.Move)):
            out.append(("restore", a.n))
            if isinstance(a, cs.Move):
                out.append(("free", a.n))
            current = a.n
        elif isinstance(a, cs.EndReverse):
            break
    return out


def test_cross_check_with_checkpoint_schedules():
    import checkpoint_schedules as cs     # a test dependency (pyproject.toml [test])
    from checkpoint_schedules.multistage import optimal_steps_binomial
    for n in range(2, 41):
        for s in range(1, min(6, n - 1) + 1):
            # that package counts one forward run per reversed step but the first
            assert optimal_steps_binomial(n, s) - (n - 1) == binomial_cost(n, s), (n, s)
            acts = translate(cs.MultistageCheckpointSchedule(n, s, 0), n)
            r = simulate(acts, n, s)
            assert r.forward_executions == binomial_cost(n, s), (n, s)
