"""Random CUDA stencil kernels, drawn from a seed, for tests/test_random_cuda.py.

:func:`draw` makes the source of a 1-D or 2-D ``@cuda.jit`` kernel: each thread (its
index from ``cuda.grid``) guarded by the margins of the stencil writes ``out`` at its
own element from a sum of terms over neighbours ``u[i + o]`` (constant or scalar
coefficients, squares, products, ``tanh``, a variable coefficient ``c``), with ``=``,
``+=`` or a step ``u + a * (...)``, some also adding a product of neighbours into a
total ``loss[0]`` with ``cuda.atomic.add``; around that write, statements that update
the own element in place, rebind ``a`` or read a neighbour that nothing uses
(:func:`_own_element_extras`); and a launch configuration whose last block is partial.  :func:`build` compiles it (as a CUDA kernel: real, or simulated under
``NUMBA_ENABLE_CUDASIM=1``) and differentiates it with kadj.
"""
import hashlib
import math

import numpy as np

COUNTERS = ("i", "j")


def _at(name, counters, off):
    parts = [c if o == 0 else f"{c} + {o}" if o > 0 else f"{c} - {-o}"
             for c, o in zip(counters, off)]
    return f"{name}[{', '.join(parts)}]"


def draw(seed):
    """(source, shape, config) of the kernel drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 3))
    lo = [int(rng.integers(0, 3)) for _ in range(ndim)]
    hi = [int(rng.integers(0, 3)) for _ in range(ndim)]
    counters = COUNTERS[:ndim]

    def nb(name="u"):
        off = [int(rng.integers(-lo[d], hi[d] + 1)) for d in range(ndim)]
        return _at(name, counters, off)

    terms = []
    for _ in range(int(rng.integers(1, 5))):
        kind = rng.choice(["lin", "sq", "prod", "tanh", "coef"])
        c = rng.choice(["0.5", "-1.5", "a"])
        if kind == "lin":
            terms.append(f"{c} * {nb()}")
        elif kind == "sq":
            v = nb()
            terms.append(f"{c} * {v} * {v}")
        elif kind == "prod":
            terms.append(f"{nb()} * {nb()}")
        elif kind == "tanh":
            terms.append(f"math.tanh({c} * {nb()})")
        else:
            terms.append(f"{nb('c')} * ({nb()} - {nb()})")
    body = " + ".join(terms)
    own = _at("out", counters, (0,) * ndim)
    form = rng.choice(["=", "+=", "step"])
    stmt = (f"{own} = {_at('u', counters, (0,) * ndim)} + a * ({body})"
            if form == "step" else f"{own} {form} {body}")
    guard = " and ".join(
        f"{lo[d]} <= {counters[d]} < u.shape[{d}]" + (f" - {hi[d]}" if hi[d] else "")
        for d in range(ndim))
    grid = "cuda.grid(1)" if ndim == 1 else "cuda.grid(2)"
    lines = [f"{', '.join(counters)} = {grid}", f"if {guard}:", f"    {stmt}"]
    if rng.random() < 0.3:          # a scalar total over the threads: an atomic sum
        lines.append(f"    cuda.atomic.add(loss, 0, {nb()} * {nb()})")
    if ndim == 1:
        block = int(rng.choice([8, 32]))
        n = int(rng.integers(lo[0] + hi[0] + 1, 3 * block))
        shape = (n,)
        config = ((n + block - 1) // block, block)
    else:
        block = (4, 8)
        shape = (int(rng.integers(lo[0] + hi[0] + 1, 11)),
                 int(rng.integers(lo[1] + hi[1] + 1, 19)))
        config = (((shape[0] + 3) // 4, (shape[1] + 7) // 8), block)
    lines = _own_element_extras(np.random.default_rng(seed + 7919), lines, counters, own,
                                nb)
    tag = hashlib.sha1("\n".join(lines).encode()).hexdigest()[:10]
    src = f"def cr_{tag}(u, c, out, a, loss):\n" + "".join(f"    {ln}\n" for ln in lines)
    return src, shape, config


def _own_element_extras(rng, lines, counters, own, nb):
    """Statements around the stencil's write (each drawn with probability 1/4; a second
    generator, so the stencil drawn from a seed stays the same): the scalar ``a``
    rebound first, a store into the own element that the stencil's write follows, a
    neighbour read guarded by the thread's coordinate and then unused or only tested,
    and the own element updated in place after the write, read linearly and inside a
    function.  (Each once had a wrong adjoint or a crash in one of the two forms.)"""
    head, stmt, tail = lines[:2], lines[2:3], lines[3:]
    pre, post = [], []
    if rng.random() < 0.25:
        pre.append("    a = 2.0 * a")
    if rng.random() < 0.25:
        pre.append(f"    {own} = {nb()}")
    if rng.random() < 0.25:
        back = _at("u", counters, (-1,) + (0,) * (len(counters) - 1))
        pre += ["    g = 0.0", f"    if {counters[0]} > 0:", f"        g = {back}"]
        if rng.random() < 0.5:
            post += ["    if g > 0.0:", f"        {own} = 0.5 * {own}"]
    if rng.random() < 0.25:
        post.append(f"    {own} = 0.5 * {own} + math.sin(a * {own})")
    return head + pre + stmt + post + tail


def args_for(shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape), 0.5 + rng.random(shape),
            rng.standard_normal(shape), float(rng.uniform(0.2, 1.2)), np.zeros(1)]


def build(src):
    """The kadj-differentiated CUDA kernel of ``src``."""
    from numba import cuda

    import kadj
    ns = {"math": math, "cuda": cuda, "__name__": __name__}
    tag = src.split("(", 1)[0].split("_", 1)[1]
    exec(compile(src, f"<kadj random cuda kernel {tag}>", "exec"), ns)
    name = src.split("(", 1)[0][4:]
    return kadj.differentiate(cuda.jit(ns[name]))
