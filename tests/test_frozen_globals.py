"""Globals changed after numba compiled the forward (:mod:`kadj.frozen_globals`).

numba freezes the globals a kernel reads when it compiles it; an adjoint built later
would see the new values.  Checked: a rebound scalar and an array changed in place are
refused by name, ``kernel.recompile()`` then gives the forward and its adjoint the new
values (gradients against central differences of the forward as it runs); an adjoint
built before a change, with the forward compiled after it, is built again with the
forward's values; a helper rebound to another jitted function; a Tape differentiates
the forward it ran; an
unchanged global neither refuses nor rebuilds.
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import kadj
import frozen_globals_kernels as m
from kadj import DifferentiationError

X = np.array([0.5, 1.0, 1.5])


def _adjoint(k, x=X):
    ax = np.zeros_like(x)
    k.adjoint(x.copy(), np.zeros_like(x), ax, np.ones_like(x))
    return ax


def _fd(k, x=X, h=1e-6):
    """Central differences of sum(y) of the forward as it runs now."""
    def f(z):
        y = np.zeros_like(z)
        k(z.copy(), y)
        return y.sum()
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(len(x))])


def test_a_rebound_scalar_is_refused_until_recompiled(monkeypatch):
    k = m.rebound
    k(X.copy(), np.zeros(3))                     # compiled with DT = 0.01
    monkeypatch.setattr(m, "DT", 0.02)
    with pytest.raises(DifferentiationError, match="'DT'") as info:
        _adjoint(k)
    assert "recompile()" in info.value.remedy
    assert np.allclose(_fd(k), 0.01 * 2 * X)     # the forward still runs with 0.01
    k.recompile()
    assert np.allclose(_fd(k), 0.02 * 2 * X)
    assert np.allclose(_adjoint(k), _fd(k), rtol=1e-7)


def test_an_array_changed_in_place_is_refused(monkeypatch):
    k = m.mutated
    k(X.copy(), np.zeros(3))
    monkeypatch.setattr(m, "W", m.W.copy())      # restored after the test
    m.W[:] = [10.0, 20.0, 30.0]
    with pytest.raises(DifferentiationError, match="'W'"):
        _adjoint(k)
    k.recompile()
    assert np.allclose(_adjoint(k), 2 * np.array([10.0, 20.0, 30.0]) * X)
    assert np.allclose(_adjoint(k), _fd(k), rtol=1e-7)


def test_an_adjoint_built_first_follows_the_forward(monkeypatch):
    k = m.adjoint_first
    assert np.allclose(_adjoint(k), 2.0 * 2 * X)  # built with C = 2, forward not compiled
    monkeypatch.setattr(m, "C", 5.0)
    k(X.copy(), np.zeros(3))                      # the forward compiles with C = 5
    assert np.allclose(_adjoint(k), 5.0 * 2 * X)  # built again with the forward's C
    assert np.allclose(_adjoint(k), _fd(k), rtol=1e-7)


def test_a_rebound_helper_is_refused(monkeypatch):
    k = m.via_helper
    k(X.copy(), np.zeros(3))

    @njit
    def other(z):
        return 7.0 * z
    monkeypatch.setattr(m, "_scaled", other)
    with pytest.raises(DifferentiationError, match="'_scaled'"):
        _adjoint(k)


def test_a_tape_differentiates_the_forward_it_ran(monkeypatch):
    k = m.on_a_tape
    x, y = X.copy(), np.zeros(3)
    with kadj.Tape() as tape:
        k(x, y)                                   # DT = 0.01 (the adjoint too)
    monkeypatch.setattr(m, "DT", 0.5)
    tape.backward(seeds=[(y, np.ones(3))])
    assert np.allclose(tape.grad(x), 0.01 * np.cos(X))
    with kadj.Tape() as tape:                     # the forward still runs with 0.01
        k(x, y)
    tape.backward(seeds=[(y, np.ones(3))])
    assert np.allclose(tape.grad(x), 0.01 * np.cos(X))


def test_an_unchanged_global_neither_refuses_nor_rebuilds():
    k = m.unchanged
    k(X.copy(), np.zeros(3))
    first = k.compiled(X, np.zeros(3))
    assert np.allclose(_adjoint(k), _fd(k), rtol=1e-7)
    k(np.zeros(5), np.zeros(5))                   # same signature: nothing compiled
    k(np.zeros(5, dtype=np.float32), np.zeros(5, dtype=np.float32))   # another one
    assert k.compiled(X, np.zeros(3)) is first
