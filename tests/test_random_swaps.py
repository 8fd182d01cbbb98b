"""Property tests: random time loops that end by permuting two or three array names
(``a, b = b, a``; ``a, b, c = c, a, b``; ``a, b, c = a, c, b``), unrolled by
:mod:`kadj.buffer_swap`, against finite differences.

Each drawn kernel updates the arrays in place or from one another (a neighbour through
a periodic index), in one to three loops per step, in a time loop from 0 or 1, then
(most of the time) reads every array after the loop, so the code after it sees the
binding the remainder leaves.  Each is checked with :func:`kadj.testing.check_grad`
(float64 central differences, bounds-checked) at trip counts 0 to 7: every remainder
of the unrolling, and none.  Seeded (the same kernels on every run); on failure the
kernel's source is in the message.  The default run draws a few kernels; ``-m slow``
many more.
"""
import math
import random

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad

pytestmark = pytest.mark.usefixtures("private_cache_dir")

NAMES = ("a", "b", "c")
TRIPS = (0, 1, 2, 3, 4, 5, 7)


def draw(seed):
    """(source, number of arrays) of kernel ``k<seed>(a, b[, c], p, T)``."""
    rng = random.Random(seed)
    arrays = NAMES[:rng.choice((2, 3))]
    loops = []
    for _ in range(rng.randint(1, 3)):
        dst = rng.choice(arrays)
        x, y = rng.choice(arrays), rng.choice(arrays)
        off = rng.choice((-1, 0, 1))
        value = f"math.tanh({x}[i] * p + {y}[(i + {off}) % n] * 0.5)"
        if rng.random() < 0.3:
            value = f"{dst}[i] * 0.5 + {value}"
        loops.append(f"        for i in range(n):\n            {dst}[i] = {value}")
    perm = list(arrays)
    while perm == list(arrays):
        rng.shuffle(perm)
    lines = [f"def k{seed}({', '.join(arrays)}, p, T):", "    n = a.shape[0]",
             f"    for t in range({rng.choice((0, 0, 1))}, T):", *loops,
             f"        {', '.join(arrays)} = {', '.join(perm)}"]
    if rng.random() < 0.7:
        lines += ["    s = 0.0", "    for i in range(n):",
                  "        s += " + " + ".join(f"{x}[i] * {j + 1}.0"
                                               for j, x in enumerate(arrays)),
                  "    return s"]
    return "\n".join(lines) + "\n", len(arrays)


def _check(seed):
    src, count = draw(seed)
    ns = {"math": math, "np": np}
    exec(compile(src, f"<kadj random swap {seed}>", "exec"), ns)
    k = kadj.differentiate(njit(ns[f"k{seed}"]))
    for trips in TRIPS:
        r = np.random.default_rng(seed * 10 + trips)
        args = tuple(r.uniform(-1.0, 1.0, 6) for _ in range(count)) + (0.7, trips)
        try:
            check_grad(k, args)
        except AssertionError as exc:
            raise AssertionError(f"{trips} steps of\n{src}\n{exc}") from None


@pytest.mark.parametrize("seed", range(6))
def test_random_swap_loop(seed):
    _check(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 60))
def test_many_random_swap_loops(seed):
    _check(seed)


def test_the_generator_draws_swaps_and_rotations():
    perms = {ln.strip() for seed in range(60) for ln in draw(seed)[0].splitlines()
             if ln.startswith("        a, b")}
    assert "a, b = b, a" in perms, perms
    assert {"a, b, c = b, c, a", "a, b, c = c, a, b"} & perms, perms    # rotations
    assert {"a, b, c = a, c, b", "a, b, c = b, a, c", "a, b, c = c, b, a"} & perms
