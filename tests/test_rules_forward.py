"""Forward-mode checks of the derivative-rule table (kadj/rules.py), from the entries'
own domains: for every entry, a one-line kernel ``y[i] = f(x0[i], x1[i], ...)`` applying
one of its keys is differentiated in forward mode (``kernel.jvp``), and its tangent at
several points of the entry's ``domain`` (real entries) or ``complex_domain`` (complex
ones: complex arrays, complex tangents) is compared with float64 central differences of
the kernel along the same tangents.  One kernel per entry, compiled once.

A representative subset runs by default; every entry with ``-m slow``.
"""
from __future__ import annotations

import math
import operator
import zlib

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.rules import RULES

N = 5       # points per entry


pytestmark = pytest.mark.usefixtures("private_cache_dir")


def _distinct(pred):
    seen, out = set(), []
    for r in RULES.values():
        if id(r) not in seen and pred(r):
            seen.add(id(r))
            out.append(r)
    return out


# entries none of whose keys numba compiles on scalars (np.clip takes arrays only in
# numba): their reverse rule is checked numerically in tests/test_rules.py
NO_SCALAR_KERNEL = {"clip"}
REAL = _distinct(lambda r: r.domain and r.name not in NO_SCALAR_KERNEL)
COMPLEX = _distinct(lambda r: r.complex_domain)
# the default run: one of each family (arithmetic, powers, kinks, trigonometric,
# exponential, several arguments, integer arguments), real and complex
DEFAULT_REAL = {"mul", "truediv", "pow", "max", "sin", "atan2", "exp", "log",
                "sqrt", "hypot", "mod", "abs", "float", "tanh"}
DEFAULT_COMPLEX = {"mul", "truediv", "exp", "log", "sqrt", "abs", "conj", "real", "imag",
                   "phase", "sin", "tanh"}


def _params(rules, default):
    return [pytest.param(r, id=r.name, marks=() if r.name in default else
                         pytest.mark.slow) for r in rules]


def _keys(rule):
    return [k for k, r in RULES.items() if r is rule and callable(k)]


def _kernel(rule, key, nargs, tag):
    """``y[i] = key(x0[i], ...)`` differentiated; an integer argument (``int_args``) is
    a scalar parameter."""
    name = f"fwd_{tag}_{zlib.crc32(rule.name.encode())}"
    params = [f"x{j}" for j in range(nargs)]
    operands = [f"x{j}" if j in rule.int_args and tag == "real" else f"x{j}[i]"
                for j in range(nargs)]
    src = (f"def {name}({', '.join(params)}, y):\n"
           f"    for i in range(y.shape[0]):\n"
           f"        y[i] = f({', '.join(operands)})\n")
    ns = {"f": key, "math": math, "np": np, "__name__": __name__}
    exec(compile(src, f"<kadj test_rules_forward {name}>", "exec"), ns)
    return kadj.differentiate(njit(ns[name]))


def _real_args(rule, rng):
    args = []
    for j, dom in enumerate(rule.domain):
        if dom is None:
            v = rule.int_args[j]
            args.append(int(v[0] if isinstance(v, (list, tuple)) else v))
        else:
            x = rng.uniform(*dom, N)
            if rule.name in ("max", "min") and j == 1:   # keep ties away
                x = np.where(np.abs(x - args[0]) < 0.1, x + 0.3, x)
            args.append(x)
    return args


def _complex_args(rule, rng):
    return [rng.uniform(*re, N) + 1j * rng.uniform(*im, N)
            for re, im in rule.complex_domain]


def _check(rule, make_args, dtype, tag):
    rng = np.random.default_rng(zlib.crc32(f"{rule.name}/{tag}".encode()))
    args = make_args(rule, rng)
    nargs = len(args)
    errors = []
    for key in _keys(rule):
        k = _kernel(rule, key, nargs, tag)
        y = np.zeros(N, dtype)
        try:
            k.forward(*args, y)
            plan = k.adjoint_plan(*args, y)
        except Exception as exc:    # this key does not compile on these values
            errors.append(f"{key!r}: {type(exc).__name__}")
            continue
        break
    else:
        pytest.fail(f"no key of {rule.name} compiles in a kernel: {errors}")
    slots = [i for i in plan.adjoint_args if i < nargs]
    tangents = {i: (rng.standard_normal(N) + (1j * rng.standard_normal(N)
                                               if dtype == np.complex128 else 0.0))
                if isinstance(args[i], np.ndarray) else np.array([0.0])
                for i in slots}
    dy = np.zeros(N, dtype)
    k.jvp(*args, y.copy(), *[tangents[i] for i in slots], dy)

    def moved(h):
        out = [a + h * tangents[i] if i in tangents and isinstance(a, np.ndarray) else a
               for i, a in enumerate(args)]
        z = np.zeros(N, dtype)
        k.forward(*out, z)
        return z

    h = 1e-6
    fd = (moved(h) - moved(-h)) / (2 * h)
    np.testing.assert_allclose(
        dy, fd, rtol=1e-6, atol=1e-8,
        err_msg=f"{rule.name} ({key!r}): tangent vs central differences")


@pytest.mark.parametrize("rule", _params(REAL, DEFAULT_REAL))
def test_rule_tangent_matches_finite_differences(rule):
    _check(rule, _real_args, np.float64, "real")


@pytest.mark.parametrize("rule", _params(COMPLEX, DEFAULT_COMPLEX))
def test_rule_tangent_matches_finite_differences_on_complex(rule):
    _check(rule, _complex_args, np.complex128, "complex")


def test_defaults_name_existing_entries():
    assert DEFAULT_REAL <= {r.name for r in REAL}
    assert DEFAULT_COMPLEX <= {r.name for r in COMPLEX}
