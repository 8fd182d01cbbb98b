"""Property tests: random time-stepping kernels, generated as source text, against
finite differences.

Hypothesis draws a kernel that advances a 1-D state ``u`` in place for ``nsteps`` steps:
each step computes a scratch row ``b`` (``np.zeros``, ``np.empty`` or ``np.ones``)
from neighbours of ``u`` (linear, squared, ``tanh``, a variable coefficient ``c``), then
writes it back into ``u`` (``u[i] = b[i]``, a blend with the old ``u[i]``, or an
update read from both), possibly keeping a second, older time level ``v`` (leapfrog),
possibly adding into a returned sum.  Such kernels overwrite the arrays they read, so
their adjoints record overwritten elements where the reverse sweep needs them
(:mod:`kadj.analysis.needed`) and recompute the rest.  Each kernel is checked with
:func:`kadj.testing.check_grad` (float64 central differences, adjoint compiled with
bounds checking) at several sizes and step counts, the tape growing past its first
capacity.

Derandomized (the same examples on every run); on failure the drawn source is printed
(Hypothesis ``note``).  The default run draws a few kernels; ``-m slow`` many more.
"""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import kadj

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402
from random_source import compile_source  # noqa: E402
from test_random_kernels import SETTINGS  # noqa: E402


def _at(name, off):
    return f"{name}[i]" if off == 0 else f"{name}[i + {off}]" if off > 0 else \
        f"{name}[i - {-off}]"


@st.composite
def time_loop_source(draw):
    """Source lines of ``def k(u, v, c, a, nsteps)``."""
    lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 2))

    def nb(name="u"):
        return _at(name, draw(st.integers(-lo, hi)))

    terms = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("lin", "sq", "tanh", "coef")))
        if kind == "lin":
            terms.append(f"{draw(st.sampled_from(('0.25', 'a', '-0.5')))} * {nb()}")
        elif kind == "sq":
            v = nb()
            terms.append(f"0.1 * {v} * {v}")
        elif kind == "tanh":
            terms.append(f"0.5 * math.tanh({nb()})")
        else:
            terms.append(f"{nb('c')} * ({nb()} - {nb()})")
    leap = draw(st.booleans())            # a second, older time level
    scratch = draw(st.sampled_from(("np.zeros(n)", "np.empty(n)", "np.ones(n)")))
    back = draw(st.sampled_from(("b[i]", "0.5 * b[i] + 0.5 * u[i]", "u[i] + a * b[i]")))
    stop = "n" + (f" - {hi}" if hi else "")
    lines = ["n = u.shape[0]", f"b = {scratch}"]
    total = draw(st.booleans())
    if total:
        lines.append("s = 0.0")
    lines.append("for step in range(nsteps):")
    lines.append(f"    for i in range({lo}, {stop}):")
    lines.append(f"        b[i] = {' + '.join(terms)}")
    if leap:
        lines += [f"    for i in range({lo}, {stop}):",
                  "        w = 2.0 * b[i] - v[i]",
                  "        v[i] = u[i]",
                  "        u[i] = 0.5 * w"]
    else:
        lines += [f"    for i in range({lo}, {stop}):", f"        u[i] = {back}"]
    if total:
        lines += ["    s += u[0] * a"]
        lines.append("return s")
    return lines


def _compile(lines):
    fn, src = compile_source("tl", "u, v, c, a, nsteps", lines, "time loop")
    return kadj.differentiate(fn, wrt=("u", "v", "c", "a")), src


#: (size, steps): no step, one, several; a tape past its first capacity (1024 entries)
SHAPES = ((5, 0), (5, 1), (6, 3), (13, 2), (300, 5))


def _data(seed, n, steps):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1.0, 1.0, n), rng.uniform(-1.0, 1.0, n),
            rng.uniform(0.2, 0.8, n), float(rng.uniform(0.1, 0.4)), steps)


def _check(lines, seed):
    k, src = _compile(lines)
    note(src)
    cases = ((f"n={n}, steps={t}", _data(seed + n + t, n, t)) for n, t in SHAPES)
    assert sweep.check_many(k, cases) == len(SHAPES)


@settings(max_examples=8, **SETTINGS)
@given(lines=time_loop_source(), seed=st.integers(0, 2**16))
def test_random_time_loop(private_cache_dir, lines, seed):
    _check(lines, seed)


@pytest.mark.slow
@settings(max_examples=50, **SETTINGS)
@given(lines=time_loop_source(), seed=st.integers(0, 2**16))
def test_many_random_time_loops(private_cache_dir, lines, seed):
    _check(lines, seed)
