"""The CPU tape never writes past its end, whatever the loop nesting and the sizes.

The adjoint's tape starts at 1024 entries per kind and grows; reservations ahead of
loops make pushes plain stores (kadj/reverse.py, ``Writer.open_frame``).  These tests
generate kernels with nested ``for``/``while`` loops, branches and ``break`` that all
record values on the tape at several levels, then run each adjoint (compiled with
bounds checking, so a write past the end is an IndexError) at many sizes, among them
sizes whose pushes end exactly at the tape's capacity, and compare one directional
derivative with float64 central differences.
"""
import math
import random

import numpy as np
import pytest
from numba import njit

import kadj


def _gen_block(rng, depth, loops, lines, pad):
    """Append statements at indentation ``pad`` to ``lines``."""
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        i = loops[-1] if loops else "0"
        j = loops[-2] if len(loops) > 1 else "0"
        if r < 0.35 or depth >= 3:
            lines.append(f"{pad}h = math.tanh(h * 0.9 + x[({i}) % nx] * 0.5)")
        elif r < 0.5:
            lines.append(f"{pad}g = math.sin(g + W[({j}) % nx, ({i}) % nw] * h)")
        elif r < 0.75:
            v = f"i{depth}"
            bound = rng.choice(["nx", "W.shape[1]", "m", "reps"])
            if bound == "m":
                lines.append(f"{pad}m = W.shape[1] - 1")
            lines.append(f"{pad}for {v} in range({bound}):")
            _gen_block(rng, depth + 1, loops + [v], lines, pad + "    ")
            if rng.random() < 0.3:
                lines.append(f"{pad}    if g > 0.95:")
                lines.append(f"{pad}        break")
        elif r < 0.88:
            v = f"w{depth}"
            lines.append(f"{pad}{v} = 0")
            lines.append(f"{pad}while {v} < reps:")
            _gen_block(rng, depth + 1, loops + [v], lines, pad + "    ")
            lines.append(f"{pad}    {v} += 1")
        else:
            lines.append(f"{pad}if h > 0.0:")
            _gen_block(rng, depth + 1, loops, lines, pad + "    ")


def make_kernel(seed):
    rng = random.Random(seed)
    lines = ["def kern(x, W, out, reps):", "    nx = x.shape[0]", "    nw = W.shape[1]",
             "    h = 0.1", "    g = 0.2", "    for k in range(nx):"]
    _gen_block(rng, 1, ["k"], lines, "        ")
    lines.append("    out[0] = h + g")
    src = "\n".join(lines) + "\n"
    ns = {"math": math}
    exec(compile(src, f"<capacity kernel {seed}>", "exec"), ns)
    return njit(ns["kern"]), src


def _bounds_checked(k, args):
    comp = k.compiled(*args)
    checked = njit(boundscheck=True, error_model="numpy")(comp.function.py_func)
    return lambda *a: checked(*a, *comp.fresh_memory())   # tapes of exactly their size


def _directional_check(k, adj, nx, nw, reps, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, nx)
    W = rng.uniform(-1, 1, (nx, nw)) * 0.3
    dx, dW = rng.standard_normal(nx), rng.standard_normal((nx, nw))

    def f(xx, WW):
        o = np.zeros(1)
        k.forward(xx, WW, o, reps)
        return o[0]

    eps = 1e-6
    fd = (f(x + eps * dx, W + eps * dW) - f(x - eps * dx, W - eps * dW)) / (2 * eps)
    ax, aW, ao = np.zeros(nx), np.zeros((nx, nw)), np.ones(1)
    x0, W0 = x.copy(), W.copy()
    adj(x, W, np.zeros(1), reps, ax, aW, ao)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(W, W0)
    got = float(np.sum(ax * dx) + np.sum(aW * dW))
    assert abs(got - fd) <= 1e-5 * (1.0 + abs(fd)), (nx, nw, reps, got, fd)


SIZES = [(1, 1, 1), (3, 5, 2), (17, 6, 3), (40, 13, 2), (146, 6, 1), (147, 6, 1),
         (170, 7, 2), (73, 13, 1), (341, 2, 1), (255, 3, 2), (500, 9, 1)]


@pytest.mark.parametrize("seed", [s if s % 2 == 0 else pytest.param(s, marks=pytest.mark.slow)
                                  for s in range(14)])   # odd seeds with -m slow
def test_generated_nested_recorders(seed):
    fn, src = make_kernel(seed)
    k = kadj.differentiate(fn)
    args = (np.zeros(3), np.zeros((3, 2)), np.zeros(1), 1)
    adj = _bounds_checked(k, args)
    for nx, nw, reps in SIZES:
        try:
            _directional_check(k, adj, nx, nw, reps, seed)
        except Exception as exc:
            raise AssertionError(f"kernel:\n{src}\nsize {(nx, nw, reps)}: {exc}") from exc


@njit
def outer_inner(x, W, out):
    """The two-line pattern that once overflowed: the outer loop records h, the inner
    loop records g, and an inner loop can end exactly at the tape's capacity."""
    h = 0.0
    g = 0.0
    for k in range(x.shape[0]):
        h = math.tanh(x[k] + h)
        for d in range(W.shape[1]):
            g = math.tanh(g + W[k, d] * h)
    out[0] = g + h


@pytest.mark.parametrize("D", [6, 13, 72])
def test_inner_loop_ending_at_capacity(D):
    # pushes: 2 before the loop, then (1 + D) per outer iteration, so an inner loop
    # ends at exactly 1024 (and 2048 ...) when (k + 1)(D + 1) == 1022 (+ 1024 ...)
    k = kadj.differentiate(outer_inner)
    rng = np.random.default_rng(D)
    H = 2 * 2046 // (D + 1) + 3
    x, W = rng.uniform(-1, 1, H), rng.uniform(-1, 1, (H, D)) * 0.2
    args = (x, W, np.zeros(1))
    adj = _bounds_checked(k, args)
    dx = rng.standard_normal(H)
    eps = 1e-6

    def f(xx):
        o = np.zeros(1)
        k.forward(xx, W, o)
        return o[0]

    fd = (f(x + eps * dx) - f(x - eps * dx)) / (2 * eps)
    ax, aW = np.zeros(H), np.zeros((H, D))
    adj(x, W, np.zeros(1), ax, aW, np.ones(1))
    assert abs(ax @ dx - fd) <= 1e-6 * (1 + abs(fd))
