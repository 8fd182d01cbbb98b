"""``checkpoints=N`` on CPU kernels: loops that carry state are reversed from N
checkpoints (kadj/checkpoint_reverse.py), so the tape does not grow with their trip
count.

Gradients are compared with float64 central differences (kadj.testing.check_grad)
for trip counts around 2**N (where the bisection runs out of slots); the tape bound
is measured by running the generated adjoint as plain Python and recording the
highest tape pointer it reaches.
"""
import re
import sys

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import call_memory
from kadj.testing import check_grad


@njit
def time_loop(x, y, a, T):
    for i in range(x.shape[0]):
        v = x[i]
        for t in range(T):
            v = v + a * np.sin(v)
        y[i] = v


@njit
def recurrence(x, y, a):
    s = 0.0
    for i in range(x.shape[0]):
        s = a * np.tanh(s) + x[i]
        y[i] = s * s


@njit
def nested(x, y, a, T, M):
    for i in range(x.shape[0]):
        v = x[i]
        for t in range(T):
            w = v
            for m in range(M):
                w = w * np.cos(a * w)
            v = 0.5 * v + w
        y[i] = v


@njit
def early_exit(x, y, a):
    for i in range(x.shape[0]):
        v = x[i]
        k = 0
        while k < 9:
            v = v + a * np.sin(v)
            k += 1
            if v > 1.2:
                break
        y[i] = v


def _trips(slots):
    n = 2 ** (slots if slots is not True else 3)
    return (1, n - 1, n, n + 1, 2 * n + 3)


@pytest.mark.parametrize("slots", [1, 2, 4, True])
def test_time_loop_gradient(slots):
    k = kadj.differentiate(time_loop, checkpoints=slots)
    x = np.linspace(0.1, 1.0, 3)
    for T in _trips(slots):
        check_grad(k, (x, np.zeros(3), 0.3, T), wrt=("x", "a"))


@pytest.mark.parametrize("slots", [1, 3])
def test_recurrence_gradient(slots):
    k = kadj.differentiate(recurrence, checkpoints=slots)
    for n in _trips(slots):
        x = np.linspace(-0.5, 1.0, n)
        check_grad(k, (x, np.zeros(n), 0.7), wrt=("x", "a"))


def test_nested_loops_gradient():
    k = kadj.differentiate(nested, checkpoints=2)
    x = np.linspace(0.1, 0.9, 2)
    for T, M in ((3, 2), (4, 5), (5, 1), (9, 3)):
        check_grad(k, (x, np.zeros(2), 0.4, T, M), wrt=("x", "a"))


def test_while_loop_with_break_gradient():
    k = kadj.differentiate(early_exit, checkpoints=2)
    x = np.array([0.1, 0.6, 1.1, 1.19])    # some exit at the break, some at k == 9
    check_grad(k, (x, np.zeros(4), 0.2), wrt=("x", "a"))


# ---- the tape stays bounded --------------------------------------------------------------
def _max_tape_height(kernel, args):
    """The highest tape pointer (over all kinds) the adjoint of ``kernel`` reaches on
    ``args``, its generated source run as plain Python."""
    adj = kernel.stages(*args, until="source")["source"].adjoint
    ns = dict(adj.namespace)
    exec(compile(adj.source, f"<{adj.name}>", "exec"), ns)
    fn = ns[adj.name]
    plan = kernel.adjoint_plan(*args)
    slots = [np.zeros_like(args[i]) if isinstance(args[i], np.ndarray) else np.zeros(1)
             for i in plan.adjoint_args]
    for s in slots:
        s[...] = 1.0
    heights = [0]

    def tracer(frame, event, arg):
        if frame.f_code is fn.__code__:
            heights.extend(v for k, v in frame.f_locals.items()
                           if k.startswith("_sp_") and isinstance(v, int))
            return tracer
        return None

    sys.settrace(tracer)
    try:
        fn(*args, *slots, *call_memory.fresh_for(fn))
    finally:
        sys.settrace(None)
    return max(heights)


def test_tape_does_not_grow_with_the_trip_count():
    x = np.linspace(0.1, 1.0, 3)
    bounded = kadj.differentiate(time_loop, checkpoints=2)
    taped = kadj.differentiate(time_loop)
    short = _max_tape_height(bounded, (x, np.zeros(3), 0.3, 4))
    long = _max_tape_height(bounded, (x, np.zeros(3), 0.3, 64))
    assert short == long <= 4
    # without checkpoints the tape records every iteration of the time loop
    assert _max_tape_height(taped, (x, np.zeros(3), 0.3, 64)) >= 64 > \
        _max_tape_height(taped, (x, np.zeros(3), 0.3, 4))
    # the recurrence carries s through the whole array: no push per element either
    r = kadj.differentiate(recurrence, checkpoints=2)
    assert _max_tape_height(r, (np.ones(4), np.zeros(4), 0.5)) == \
        _max_tape_height(r, (np.ones(80), np.zeros(80), 0.5))
    # and the source says so: the time loop is reversed from 2 checkpoints
    src = bounded.adjoint_source(x, np.zeros(3), 0.3, 4)
    assert "reversed from checkpoints (2 slots" in src
    assert re.search(r"= _kept_array\(_keep_\w+, 2, np\.float64, _keep_need, \d+\)", src)


def test_without_checkpoints_nothing_changes():
    x = np.linspace(0.1, 1.0, 3)
    src = kadj.differentiate(time_loop).adjoint_source(x, np.zeros(3), 0.3, 4)
    assert "reversed from checkpoints" not in src and "np.empty(2" not in src


def test_checkpoints_option_values():
    assert kadj.differentiate(time_loop, checkpoints=True).options["checkpoints"] == 24
    assert kadj.differentiate(time_loop, checkpoints=3).options["checkpoints"] == 3
    assert kadj.differentiate(time_loop).options["checkpoints"] is None
    for bad in (0, -2, 1.5, False, "4"):
        with pytest.raises(ValueError, match="positive number of slots"):
            kadj.differentiate(time_loop, checkpoints=bad)


# ---- gallery kernels whose adjoint changes with checkpoints= --------------------------------
@pytest.mark.parametrize("name", ["thomas_batched", "euler_until", "first_crossing"])
def test_gallery_kernels_with_checkpoints(name):
    """A batched tridiagonal solve (arrays overwritten around the checkpointed loop),
    a while loop until a threshold, a loop left by ``break``."""
    from kernels.cpu import GALLERY
    ex, = [e for e in GALLERY if e.name == name]
    args = tuple(ex.make_args(np.random.default_rng(20240611)))
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt, checkpoints=2)
    assert "reversed from checkpoints (2 slots" in k.adjoint_source(*args)
    check_grad(k, args, wrt=ex.wrt, rtol=1e-5, atol=1e-6)


def test_stages_show_the_checkpointed_loop():
    """The option reaches the analysis as its carried_replay policy; the facts name the
    carried state of the time loop, and its reversal in the adjoint IR is
    checkpointed (the element loop around it is replayed per iteration)."""
    args = (np.ones(3), np.zeros(3), 0.3, 5)
    k = kadj.differentiate(time_loop, checkpoints=2)
    facts = k.show_stage("facts", *args)
    assert "policy.carried_replay: yes" in facts
    assert any(line.startswith("checkpoint[for t in range(T)") and line.endswith(": v")
               for line in facts.splitlines())
    ir_text = k.show_stage("adjoint-ir", *args)
    assert "ReverseLoop(strategy='checkpointed'" in ir_text
    assert "ReverseLoop(strategy='replayed'" in ir_text
    plain = kadj.differentiate(time_loop).show_stage("facts", *args)
    assert "policy.carried_replay: yes" not in plain and "checkpoint[" not in plain


# A loop counter read after its loop (``x[j % n]`` after ``for j in range(m)``, inside
# a branch of an outer loop reversed from checkpoints) is saved before that outer loop,
# where nothing has assigned it yet: the adjoint did not declare it and numba refused
# to compile it ("Variable 'j' is not defined").  Found by random kernels; compiled from
# this text (the failure depends on the kernel's exact shape).
_COUNTER_AFTER_LOOP = '''def counter_after_loop(x, a, y):
    n = x.shape[0]
    m = a.shape[1]
    s = math.sqrt(x[n - 1] + 1.0) * x[0] * 0.5
    t = s * x[0]
    w = t + x[n - 1]
    for i in range(n):
        t = math.exp(x[0])
        y[i] += 0.0
        if x[i] > 0.5:
            s = math.exp(x[i])
            t = math.exp(-x[i] * x[i])
            for j in range(m):
                t = math.tanh(x[n - 1] + s)
                u = s + x[n - 1]
                u = math.cos(u) * x[i] + x[j % n] * 0.3
            y[0 % n] += x[j % n] * w
            t = math.exp(-w * w)
'''


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_counter_read_after_its_loop_is_declared_for_checkpoints(dtype):
    import math as _math
    from kadj.testing import check_grad
    ns = {"math": _math}
    exec(compile(_COUNTER_AFTER_LOOP, "<counter_after_loop>", "exec"), ns)
    fn = njit(ns["counter_after_loop"])
    rng = np.random.default_rng(3)
    for n in (1, 4, 9):
        x = rng.uniform(0.6, 0.9, n).astype(dtype)
        a = rng.uniform(0.1, 0.9, (n, 3)).astype(dtype)
        check_grad(kadj.differentiate(fn, checkpoints=True), (x, a, np.zeros(n, dtype)))
