"""Python's cyclic collector stays off while kadj generates and numba compiles an
adjoint (kadj.gc_pause), and is left as it was."""
import gc

import numba
import numpy as np
import pytest

import kadj
from kadj.gc_pause import collector_paused

from fdcheck import fd_check


@numba.njit
def _smooth(u, out, a):
    for i in range(1, u.shape[0] - 1):
        out[i] = u[i] + a * (u[i - 1] - 2.0 * u[i] + u[i + 1])


def _recording(monkeypatch, module, name, seen):
    """Replace ``module.name`` by a wrapper that notes whether the collector is on."""
    fn = getattr(module, name)

    def wrapper(*a, **kw):
        seen.append((name, gc.isenabled()))
        return fn(*a, **kw)
    monkeypatch.setattr(module, name, wrapper)


def test_collector_off_while_generating_and_compiling(monkeypatch):
    from numba.core import compiler

    from kadj import analysis
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    seen = []
    _recording(monkeypatch, analysis, "analyze", seen)          # a generation stage
    _recording(monkeypatch, compiler, "compile_extra", seen)    # numba's compile
    k = kadj.differentiate(_smooth)
    u = np.linspace(0.0, 1.0, 16)
    args = (u, np.zeros_like(u), 0.1)
    k.adjoint(*args, np.zeros_like(u), np.ones_like(u), np.zeros(1))
    assert {name for name, _ in seen} == {"analyze", "compile_extra"}
    assert not any(on for _, on in seen), seen
    assert gc.isenabled()
    fd_check(k, args)


def test_collections_go_on_outside():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_turned_back_on_after_an_error():
    with pytest.raises(ValueError):
        with collector_paused():
            raise ValueError("inside")
    assert gc.isenabled()
