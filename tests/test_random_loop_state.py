"""Property tests: random loops that carry state under tests, against finite differences.

Hypothesis draws a loop over elements whose body mixes values that carry a derivative
(``c``, the arrays) with state that carries none but decides what the loop does: a
step size ``h`` scaled under a test, an integer counter ``k`` that also indexes, a
flag ``on``, a value ``w2`` set to constants, and a ``while`` loop that advances ``h`` (its entry tests change from one
iteration to the next), nested in ``if``/``else`` up to two deep, optionally with an
inner ``for`` loop (possibly left by ``break``) that reads ``u = x[i]`` of its
iteration.  The reverse sweep must re-decide every test with each
iteration's own values and restore the state each iteration saw; ``checkpoints=2``
reverses the ``while`` loops and the carried state from checkpoints instead.  Each
kernel is checked with :func:`kadj.testing.check_grad` (float64 central differences,
adjoint compiled with bounds checking) at several sizes, with and without
checkpoints.  (The families of wrong gradients this found, fixed: tests decided in
reverse with the last iteration's value, a ``while`` loop's trip count and the values
it reads taken from the last iteration.)  It also draws a test that only sets
constants (``w2``) on an element the iteration overwrites, and an inner loop left by
``break`` that reads ``u``, recomputed for its replay from checkpoints: the two wrong
gradients found there are pinned by tests/test_reverse_decisions.py and
tests/test_checkpoint_nested.py, which these draws did not reproduce on the old code.

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

VALUES = ("x[i]", "y[i]", "x[k]", "a", "c", "h", "h", "float(k)", "z[i]", "x[i - 1]",
          "x[i] * h", "y[i] * float(k + 1)", "w2", "x[i] * w2", "u")
TESTS = ("x[i] > 0.0", "x[i] > 0.3", "x[i] > -0.4", "h < 0.7", "k < 2", "on",
         "y[i] < 0.0", "c > 0.2", "i % 2 == 0")
STATE = ("h = h * 0.9", "h = h + 0.25", "h = min(h * 1.5, 2.0)", "h = 0.5 * h + 0.1",
         "k = min(k + 1, n - 1)", "k = i", "k = 0", "on = True", "on = False",
         "on = not on", "w2 = 0.5", "w2 = 1.3")
TARGETS = ("y[i]", "z[i]", "z[k]", "y[i - 1]")


@st.composite
def expr(draw, depth=2):
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(VALUES))
    form = draw(st.sampled_from(("math.sin({})", "({}) * ({})", "({}) + ({})")))
    args = [draw(expr(depth - 1)) for _ in range(form.count("{}"))]
    return form.format(*args)


@st.composite
def block(draw, indent, depth, state_only=False):
    """Statements; ``state_only``: updates of the state alone (a branch with nothing
    to differentiate, which the reverse sweep enters only to restore the state)."""
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("state", "state", "state", "active", "store", "store",
                                     "store", "if", "if", "while", "pick")))
        if kind in ("if", "while") and depth >= 2:
            kind = "store"
        if state_only and kind in ("active", "store"):
            kind = "state"
        if kind == "state":
            lines.append(indent + draw(st.sampled_from(STATE)))
        elif kind == "active":
            lines.append(f"{indent}c {draw(st.sampled_from(('=', '+=')))} {draw(expr())}")
        elif kind == "store":
            lines.append(f"{indent}{draw(st.sampled_from(TARGETS))} "
                         f"{draw(st.sampled_from(('=', '+=')))} {draw(expr())}")
        elif kind == "if":
            only = draw(st.booleans())
            lines.append(f"{indent}if {draw(st.sampled_from(TESTS))}:")
            lines += draw(block(indent + "    ", depth + 1, only))
            if draw(st.booleans()):
                lines.append(f"{indent}else:")
                lines += draw(block(indent + "    ", depth + 1, only))
        elif kind == "pick":
            # constants chosen by a test, read by what follows (the test may read an
            # element the iteration overwrites afterwards)
            lines += [f"{indent}if {draw(st.sampled_from(TESTS + ('z[i] > 0.0',)))}:",
                      f"{indent}    w2 = 0.5", f"{indent}else:", f"{indent}    w2 = 1.3"]
        else:
            lines += [f"{indent}w = 0", f"{indent}while w < 2 and h < 3.0:",
                      f"{indent}    h = h + 0.4", f"{indent}    w += 1"]
    return lines


@st.composite
def state_source(draw):
    """Source lines of ``def k(x, y, z, a)``."""
    lines = ["n = x.shape[0]", "h = 1.0", "k = 0", "c = 0.0", "on = False", "w2 = 1.0",
             "for i in range(n):", "    u = x[i]"]
    if draw(st.booleans()):
        lines += [f"    if {draw(st.sampled_from(('y[i] < 0.0', 'z[i] > 0.0', 'h < 0.7')))}:",
                  "        w2 = 0.5", "    else:", "        w2 = 1.3"]
    lines += draw(block("    ", 0))
    if draw(st.booleans()):
        lines.append(f"    for j in range({draw(st.sampled_from((2, 3)))}):")
        if draw(st.booleans()):
            lines += [f"        if {draw(st.sampled_from(('c > 0.5', 'h < 0.8', 'c < -0.3')))}:",
                      "            break"]
        lines += draw(block("        ", 1))
    lines.append("return c * a + h")
    return lines


SIZES = (1, 2, 5, 13)


def _data(seed, n):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, n), rng.uniform(-1, 1, n), rng.uniform(-1, 1, n), 0.6)


def _check(lines, seed):
    fn, src = compile_source("ls", "x, y, z, a", lines, "loop state")
    note(src)
    for checkpoints in (None, 2):
        k = kadj.differentiate(fn, checkpoints=checkpoints)
        for n in SIZES:
            sweep.check_redrawing_ties(
                k, f"n={n}, checkpoints={checkpoints}",
                lambda attempt, n=n: _data(seed + n + 1000 * attempt, n), note)


@settings(max_examples=12, **SETTINGS)
@given(lines=state_source(), seed=st.integers(0, 2**16))
def test_random_loop_state(private_cache_dir, lines, seed):
    _check(lines, seed)


@pytest.mark.slow
@settings(max_examples=60, **SETTINGS)
@given(lines=state_source(), seed=st.integers(0, 2**16))
def test_many_random_loop_states(private_cache_dir, lines, seed):
    _check(lines, seed)
