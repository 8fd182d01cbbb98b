"""A loop reversed from checkpoints saves only its carried state.

A checkpoint holds the variables live at the loop body's entry (read before they are
written in an iteration, on some path: a conditionally assigned value read later in
the body is one) and the iteration count; a temporary the body defines afresh in every
iteration is recomputed by the replays, and a value read after the loop is restored
from the tape after the loop's reverse.  Gradients are compared with float64 central
differences (kadj.testing.check_grad).
"""
import re

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def mixed_state(x, y, z, a, T):
    for i in range(x.shape[0]):
        v = x[i]
        m = 0.0
        last = 0.0
        for t in range(T):
            d = a * np.sin(v)           # iteration-local temporaries
            e = d * d + v
            if e > 0.45:
                m = e                   # conditionally assigned, read below: carried
            last = e * m + d            # assigned every iteration, read after the loop
            v = v + 0.1 * (d - 0.2 * m) + 0.05 * np.tanh(last)
        y[i] = v
        z[i] = last * v


def _checkpointed(src):
    """The variables whose checkpoint slots the adjoint declares."""
    return sorted(re.findall(r"^\s*_ck_([a-z_]+?)\d+ = _kept_array\(", src, re.M))


@pytest.mark.parametrize("T", [1, 3, 4, 9])
def test_carried_state_only_and_the_gradient(T):
    k = kadj.differentiate(mixed_state, checkpoints=2)
    x = np.array([0.05, 0.3, 0.7, 1.1])
    args = (x, np.zeros(4), np.zeros(4), 0.8, T)
    src = k.adjoint_source(*args)
    assert "reversed from checkpoints (2 slots" in src
    # v and m are carried; d, e and last are defined afresh in every iteration
    assert _checkpointed(src) == ["iter", "m", "v"]
    check_grad(k, args, wrt=("x", "a"))
    # both branches of the condition are taken across elements and iterations
    e0 = 0.8 ** 2 * np.sin(x) ** 2 + x
    assert (e0 > 0.45).any() and (e0 <= 0.45).any()


def test_facts_and_source_agree_on_the_carried_set():
    args = (np.ones(2), np.zeros(2), np.zeros(2), 0.5, 3)
    k = kadj.differentiate(mixed_state, checkpoints=2)
    facts = k.show_stage("facts", *args)
    line, = [s for s in facts.splitlines() if s.startswith("checkpoint[for t in range(T)")]
    assert line.endswith(": m, v")
    assert _checkpointed(k.adjoint_source(*args)) == ["iter", "m", "v"]


def test_cuda_checkpoint_slots_hold_the_carried_state():
    """Midpoint RK2: x and v are carried; the stages ax, xm, vm, axm are recomputed,
    and nothing but x and v (and the iteration) takes per-thread checkpoint memory."""
    pytest.importorskip("numba.cuda")
    from kernels.cuda import by_name
    case = by_name("damped_oscillator_rk2")
    args = case.make_args(np.random.default_rng(0))
    loop, = case.kernel.adjoint_report(*args)["loops"]
    assert loop["carried"] == loop["checkpointed"] == ["v", "x"]
    src = case.kernel.adjoint_source(*args)
    slots = re.findall(r"^\s*_ck_([a-z_]+?)\d+ = cuda\.local\.array\(", src, re.M)
    assert sorted(slots) == ["iter", "v", "x"]
