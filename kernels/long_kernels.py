"""A long kernel: an explicit scheme of many limited updates written out in one
function, generated for any number of steps (the shape that makes adjoints long: each
step's temporaries, branches and overwritten values are the adjoint's too).

``limiter_kernel(steps, directory)`` writes the kernel's source to a file in
``directory`` (numba and kadj read a kernel's source from its file) and returns the
``@njit`` kernel ``limiter(u, out, nu)``.  ``tests/test_lean_passes.py`` checks a
12-step kernel's gradient; ``scripts/bench_compile.py --limiter 25 50 100`` times the
compilation of longer ones.
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys


def limiter_source(steps):
    """The source of ``limiter(u, out, nu)``: per interior element, ``steps`` limited
    updates of three values, one after the other."""
    lines = ["import math", "from numba import njit", "", "", "@njit",
             "def limiter(u, out, nu):",
             "    for i in range(1, u.shape[0] - 1):",
             "        a = u[i - 1]", "        b = u[i]", "        c = u[i + 1]"]
    for _ in range(steps):
        lines += ["        d1 = b - a", "        d2 = c - b",
                  "        if d1 * d2 > 0.0:", "            s = min(abs(d1), abs(d2))",
                  "        else:", "            s = 0.0",
                  "        a = a + nu * (b - a)", "        b = b + nu * s * math.tanh(d2)",
                  "        c = c - nu * (c - b)"]
    lines += ["        out[i] = a + b + c"]
    return "\n".join(lines) + "\n"


def limiter_kernel(steps, directory):
    """The ``steps``-step kernel, its source written to ``directory``."""
    path = pathlib.Path(directory) / f"limiter_{steps}.py"
    path.write_text(limiter_source(steps))
    spec = importlib.util.spec_from_file_location(f"limiter_{steps}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.limiter
