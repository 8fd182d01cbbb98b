"""tape.schedule(): the reversed dependency graph of the recorded launches, split over
streams (checked without a GPU); the simulator runs it (tests/tape_sim_cases.py)."""
import itertools

import numba
import numpy as np
import pytest

import kadj
from kadj import tape_graph
from kadj.errors import DifferentiationError

from test_tape_device import run_cases

N = 6
RNG = np.random.default_rng(4)


@kadj.differentiate
@numba.njit
def adv(u, v, alpha):
    for i in range(u.shape[0]):
        v[i] = u[i] * (1.0 + alpha * u[i])


@kadj.differentiate
@numba.njit
def mix(a, b, out):
    for i in range(a.shape[0]):
        out[i] = out[i] + a[i] * b[i]


@kadj.differentiate
@numba.njit
def total(u, w, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += u[i] * w[i]
    out[0] = s


def alternating(steps=4, tape_kw=None):
    us = [RNG.random(N)] + [np.zeros(N) for _ in range(steps)]
    ws = [RNG.random(N)] + [np.zeros(N) for _ in range(steps)]
    out = np.zeros(1)
    with kadj.Tape(**(tape_kw or {})) as tape:
        for k in range(steps):
            adv(us[k], us[k + 1], 0.1)
            adv(ws[k], ws[k + 1], 0.2)
        total(us[-1], ws[-1], out)
    return tape, us, ws, out


def happens_before(nodes):
    """Pairs (a, b): adjoint a is finished before adjoint b starts, by stream order and
    events alone."""
    done = {}                      # launch -> set of launches complete before it ends
    tails = {}
    for n in nodes:
        before = set()
        if n.stream in tails:
            t = tails[n.stream]
            before |= done[t] | {t}
        for d in n.waits:
            before |= done[d] | {d}
        done[n.launch] = before
        tails[n.stream] = n.launch
    return done


def check_ordered(tape, nodes):
    """Every two adjoints sharing an adjoint buffer run in reverse tape order."""
    done = happens_before(nodes)
    launches = tape.launches
    for a, b in itertools.combinations([n.launch for n in nodes], 2):
        if set(tape_graph.slot_keys(launches[a])) & set(tape_graph.slot_keys(launches[b])):
            later, earlier = max(a, b), min(a, b)
            assert later in done[earlier], f"{earlier} may start before {later} ends"


def test_two_fields_in_alternation_get_two_streams_joined_at_the_loss():
    tape, us, ws, out = alternating()
    nodes = tape.schedule(streams=2)
    assert [n.launch for n in nodes] == list(range(8, -1, -1))
    assert nodes[0].kernel == "total" and nodes[0].stream == 0
    u_streams = {n.stream for n in nodes if n.kernel == "adv" and n.launch % 2 == 0}
    w_streams = {n.stream for n in nodes if n.kernel == "adv" and n.launch % 2 == 1}
    assert len(u_streams) == len(w_streams) == 1 and u_streams != w_streams
    waiting = [n for n in nodes if n.waits]
    assert len(waiting) == 1 and waiting[0].waits == (8,)     # on the loss only
    assert [n.launch for n in nodes if n.record] == [8]
    check_ordered(tape, nodes)
    one = tape.schedule(streams=1)
    assert {n.stream for n in one} == {0} and not any(n.waits for n in one)
    # more streams than chains: the same two chains
    assert {n.stream for n in tape.schedule(streams=4)} == {0, 1}


def test_where_fields_meet_every_shared_buffer_is_ordered():
    """Three fields, kernels that read two of them and update a third in place: every
    pair of adjoints sharing a buffer is ordered, with few events."""
    fields = [RNG.random(N) for _ in range(3)]
    acc = [np.zeros(N) for _ in range(3)]
    out = np.zeros(1)
    with kadj.Tape() as tape:
        for k in range(6):
            a, b, c = k % 3, (k + 1) % 3, (k + 2) % 3
            adv(fields[a], acc[a], 0.1)
            mix(acc[a], fields[b], acc[c])
        total(acc[0], acc[1], out)
    for streams in (1, 2, 3):
        nodes = tape.schedule(streams=streams)
        check_ordered(tape, nodes)
        assert {n.stream for n in nodes} <= set(range(streams))
        total_waits = sum(len(n.waits) for n in nodes)
        assert total_waits <= len(nodes)
    # a wait dropped is caught by the check (the check can fail)
    tape, us, ws, out = alternating()
    nodes = tape.schedule(streams=2)
    dropped = [tape_graph.ScheduleNode(n.launch, n.kernel, n.stream, (), n.record,
                                       n.barrier) for n in nodes]
    with pytest.raises(AssertionError):
        check_ordered(tape, dropped)


def test_cpu_backward_with_streams_equals_in_order_backward():
    tape, us, ws, out = alternating(tape_kw={"streams": 3})
    tape.backward(out)
    g = tape.grad(us[0]), tape.grad(ws[0])
    tape.zero()
    tape.backward(out, streams=1)
    np.testing.assert_array_equal(g[0], tape.grad(us[0]))
    np.testing.assert_array_equal(g[1], tape.grad(ws[0]))
    with pytest.raises(DifferentiationError, match="positive integer"):
        tape.backward(out, streams=0)
    with pytest.raises(DifferentiationError, match="positive integer"):
        kadj.Tape(streams=1.5)


def test_schedule_with_wrt_lists_only_the_needed_adjoints():
    tape, us, ws, out = alternating()
    nodes = tape.schedule(streams=2, wrt=[us[0]], loss=out)
    assert sorted(n.launch for n in nodes) == [0, 2, 4, 6, 8]
    assert {n.stream for n in nodes} == {0}


def test_checkpointed_loop_entries_are_barriers():
    u0, v0 = RNG.random(N), np.zeros(N)
    w = RNG.random(N)
    out = np.zeros(1)

    def step(i, u, v):
        adv(u, v, 0.1)
        return v, u
    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (u0, v0), steps=4, snapshots=2)
        total(u, w, out)
    nodes = tape.schedule(streams=2)
    assert [n.barrier for n in nodes] == [False] + [True] * (len(nodes) - 1)
    check_ordered(tape, nodes)
    # wrt= keeps the loop's entries (their dataflow is opaque): the same gradient
    tape.backward(out, wrt=[u0])
    g = tape.grad(u0)
    tape.zero()
    tape.backward(out)
    np.testing.assert_allclose(g, tape.grad(u0), rtol=1e-12)
    assert np.abs(g).max() > 0


def test_streams_in_simulator():
    status, detail = run_cases(["streams_in_simulator"])["streams_in_simulator"]
    assert status == "OK", detail
