"""Nested-loop recorders: kernels whose adjoints record values in an outer loop *and*
in the loops nested inside it, for sweeping the shapes (outer, inner) at which the
tape fills up.

An outer loop ``for k in range(outer)`` overwrites a loop-carried value that the
adjoint must record each iteration; an inner loop over ``inner`` (``for``, ``while``,
with ``break`` or ``continue``, triangular, or two levels deep) records too, so the
tape's height when each inner loop starts depends on both sizes.  Branches on integer
arrays make some iterations record in one arm only.  Every kernel writes ``out`` (one
value per outer iteration) from ``tanh`` recurrences, which stay bounded at any size.

These are not in :data:`kernels.cpu.GALLERY` (their point is the shape sweep of
``tests/test_size_sweep.py``); ``SHAPED`` lists them as :class:`Shaped` entries.

Example::

    from kernels.cpu.recorders import by_name
    rec = by_name("carried_inner")
    args = rec.shaped(np.random.default_rng(0), 147, 6)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import njit


@dataclass(frozen=True)
class Shaped:
    """A kernel swept over two sizes.

    name:    unique name, used as the test id.
    kernel:  the plain ``@njit`` kernel.
    shaped:  ``shaped(rng, outer, inner) -> tuple`` of arguments for an outer loop of
             ``outer`` trips over inner loops of up to ``inner`` trips.
    note:    what the kernel exercises.
    """

    name: str
    kernel: Callable
    shaped: Callable
    note: str = ""


@njit
def carried_inner(x, w, out):
    """h recorded per outer trip, g carried across outer trips and recorded per inner
    trip: (k + 1) * (inner + 1) + 2 entries after outer trip k."""
    h = 0.0
    g = 0.0
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        for d in range(w.shape[1]):
            g = math.tanh(g + w[k, d] * h)
        out[k] = g


@njit
def reset_inner(x, w, out):
    """As carried_inner, with g reset every outer trip (two records per outer trip)."""
    h = 0.0
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        g = 0.0
        for d in range(w.shape[1]):
            g = math.tanh(g + w[k, d] * h)
        out[k] = g * h


@njit
def inner_while(x, w, trips, out):
    """The inner loop a ``while`` with trips[k] (0..inner) iterations."""
    h = 0.0
    g = 0.0
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        d = 0
        while d < trips[k]:
            g = math.tanh(g + w[k, d] * h)
            d += 1
        out[k] = g


@njit
def inner_break(x, w, trips, out):
    """The inner ``for`` left by ``break`` after trips[k] iterations."""
    h = 0.0
    g = 0.0
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        for d in range(w.shape[1]):
            if d == trips[k]:
                break
            g = math.tanh(g + w[k, d] * h)
        out[k] = g + h


@njit
def inner_continue(x, w, skip, out):
    """Inner iterations with skip[k, d] != 0 skipped by ``continue``."""
    h = 0.0
    g = 0.0
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        for d in range(w.shape[1]):
            if skip[k, d] != 0:
                continue
            g = math.tanh(g + w[k, d] * h)
        out[k] = g


@njit
def one_arm(x, w, arm, out):
    """Outer and inner trips record in one branch arm only: the other arm's update is
    linear and needs no record."""
    h = 0.0
    g = 0.0
    for k in range(w.shape[0]):
        if arm[k] != 0:
            h = math.tanh(x[k] + h)
        else:
            h = 0.5 * h + x[k]
        for d in range(w.shape[1]):
            if (k + d) % 3 == 0:
                g = math.tanh(g + w[k, d] * h)
            else:
                g = 0.5 * g + w[k, d] * h
        out[k] = g


@njit
def triangular_inner(x, w, out):
    """Inner trip count (7 k) mod (inner + 1): the inner loops end at every height."""
    h = 0.0
    g = 0.0
    m = w.shape[1] + 1
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        for d in range((7 * k) % m):
            g = math.tanh(g + w[k, d] * h)
        out[k] = g


@njit
def three_levels(x, w, v, out):
    """Three nested loops, each recording its own loop-carried value."""
    h = 0.0
    g = 0.0
    e = 0.0
    for k in range(w.shape[0]):
        h = math.tanh(x[k] + h)
        for d in range(w.shape[1]):
            g = math.tanh(g + w[k, d] * h)
            for c in range(v.shape[1]):
                e = math.tanh(e + v[d, c] * g)
        out[k] = e + g


@njit
def while_outer(x, w, out):
    """The outer loop a ``while`` over k, the inner a ``for``."""
    h = 0.0
    g = 0.0
    k = 0
    while k < w.shape[0]:
        h = math.tanh(x[k] + h)
        for d in range(w.shape[1]):
            g = math.tanh(g + w[k, d] * h)
        out[k] = g
        k += 1


@njit
def while_true_outer(x, w, out):
    """``while True`` outer loop left by ``break``; the inner loop a ``while``."""
    h = 0.0
    g = 0.0
    k = 0
    while True:
        if k >= w.shape[0]:
            break
        h = math.tanh(x[k] + h)
        d = 0
        while d < w.shape[1]:
            g = math.tanh(g + w[k, d] * h)
            d += 1
        out[k] = g
        k += 1


def _base(rng, outer, inner):
    outer, inner = max(int(outer), 1), max(int(inner), 0)
    return (0.5 * rng.standard_normal(outer), 0.5 * rng.standard_normal((outer, inner)),
            np.zeros(outer))


def _trips(rng, outer, inner):
    x, w, out = _base(rng, outer, inner)
    return x, w, rng.integers(0, w.shape[1] + 1, w.shape[0]).astype(np.int64), out


def _skips(rng, outer, inner):
    x, w, out = _base(rng, outer, inner)
    return x, w, (rng.random(w.shape) < 0.3).astype(np.int64), out


def _arms(rng, outer, inner):
    x, w, out = _base(rng, outer, inner)
    return x, w, (rng.random(w.shape[0]) < 0.5).astype(np.int64), out


def _three(rng, outer, inner):
    x, w, out = _base(rng, outer, inner)
    return x, w, 0.5 * rng.standard_normal((w.shape[1], 3)), out


SHAPED = [
    Shaped("carried_inner", carried_inner, _base,
           "outer and inner records; overruns when an inner loop ends at capacity"),
    Shaped("reset_inner", reset_inner, _base, "two records per outer trip"),
    Shaped("inner_while", inner_while, _trips, "inner while, varying trip counts"),
    Shaped("inner_break", inner_break, _trips, "inner for left by break"),
    Shaped("inner_continue", inner_continue, _skips, "inner for with continue"),
    Shaped("one_arm", one_arm, _arms, "records in one branch arm only"),
    Shaped("triangular_inner", triangular_inner, _base, "inner trip count varies"),
    Shaped("three_levels", three_levels, _three, "three nested recording loops"),
    Shaped("while_outer", while_outer, _base, "outer while, inner for"),
    Shaped("while_true_outer", while_true_outer, _base,
           "outer while True with break, inner while"),
]


def by_name(name):
    """The entry of :data:`SHAPED` called ``name``."""
    for rec in SHAPED:
        if rec.name == name:
            return rec
    raise KeyError(f"no nested-recorder kernel named {name!r}")
