"""Compile time of adjoints against their forwards, per gallery kernel.

For every CPU gallery kernel: the seconds numba takes to compile the forward (a fresh
``njit`` of the kernel's Python function, run once), and the seconds kadj takes to
generate its adjoint and numba to compile it (run once), with neither cache (fresh
dispatchers, and a fresh ``KADJ_CACHE_DIR``).  kadj's jitted runtime helpers (the tape's
growth) are compiled once per installation and cached; they are compiled before the
timing starts, by a warm-up kernel.  For every CUDA gallery kernel (with
``--cuda``): the forward's ``compile_ptx`` against the adjoint's generation and
``compile_ptx`` (no GPU needed).  Prints one row per kernel and the median, geometric
mean and largest ratio, and the ratio of the sums; ``--json FILE`` writes the rows.

    python scripts/bench_compile.py [--cuda] [--only NAME ...] [--clock wall|process]

``--clock process`` (the default) counts this process's CPU seconds: steadier than
wall-clock time on a machine that other work shares (numba compiles on this thread).

``--passes 2`` compiles the gallery twice in one process, each pass with fresh
dispatchers and a fresh ``KADJ_CACHE_DIR`` (nothing compiled is reused), and reports
both passes.  The first pass charges each kernel with what numba compiles once per
process for the first kernel that needs it (an overload's implementation for a new
dtype, a typing template's first use), forwards and adjoints alike; the second shows
what each kernel costs on its own, in a process that has compiled kernels before.

``--limiter STEPS ...`` times a long kernel instead of the gallery: an explicit scheme
of STEPS limited updates written out in one function (``kernels/long_kernels.py``),
with the number of lines of its adjoint.

``--repeat N`` compiles each kernel's forward and adjoint N times in turn (fresh
dispatchers and a fresh ``KADJ_CACHE_DIR`` each time; the forward first in odd rounds,
the adjoint first in even ones) and keeps the least time of each: what numba compiles
once per process for the first kernel that needs it, and the load of other work on the
machine, weigh on single compiles by up to a factor of two.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# every cache this run makes lies in one directory, removed when the run ends
_SCRATCH = tempfile.mkdtemp(prefix="kadj-bench-compile-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["KADJ_CACHE_DIR"] = tempfile.mkdtemp(dir=_SCRATCH)
os.environ.pop("KADJ_DISABLE_CACHE", None)

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_clock = time.process_time


def _timed(fn):
    t0 = _clock()
    fn()
    return _clock() - t0


def _fresh_cpu(dispatcher):
    from numba import njit
    opts = {k: v for k, v in (getattr(dispatcher, "targetoptions", {}) or {}).items()
            if k in ("fastmath", "error_model", "boundscheck", "nogil", "parallel")}
    return njit(**opts)(dispatcher.py_func)


def _copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _adjoint_buffers(k, args):
    from kadj.tape_measure import adjoint_buffers
    return adjoint_buffers(k.adjoint_plan(*args), args, fill=0.0)


def _fresh_cache():
    os.environ["KADJ_CACHE_DIR"] = tempfile.mkdtemp(dir=_SCRATCH)


def _cpu_forward(ex, args):
    fwd = _fresh_cpu(ex.kernel)
    return _timed(lambda: fwd(*_copy(args)))


def _cpu_adjoint(ex, args):
    """(generate seconds, compile seconds) of a fresh differentiated kernel."""
    import kadj
    k = kadj.differentiate(_fresh_cpu(ex.kernel), wrt=ex.wrt)
    t_gen = _timed(lambda: k.adjoint_source(*args))
    t_comp = _timed(lambda: k.adjoint(*_copy(args), *_adjoint_buffers(k, args)))
    return t_gen, t_comp


def cpu_rows(only, repeat=1):
    from kernels.cpu import GALLERY
    rows = []
    for ex in GALLERY:
        if only and ex.name not in only:
            continue
        args = ex.make_args(np.random.default_rng(0))
        t_fwd = t_gen = t_comp = math.inf
        try:
            for r in range(repeat):
                if repeat > 1:
                    _fresh_cache()
                if r % 2 == 0:
                    t_fwd = min(t_fwd, _cpu_forward(ex, args))
                gen, comp = _cpu_adjoint(ex, args)
                if r % 2 == 1:
                    t_fwd = min(t_fwd, _cpu_forward(ex, args))
                t_gen, t_comp = min(t_gen, gen), min(t_comp, comp)
        except Exception as exc:   # a kernel kadj refuses has no adjoint to time
            print(f"  {ex.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        rows.append({"target": "cpu", "kernel": ex.name, "forward_s": t_fwd,
                     "generate_s": t_gen, "compile_s": t_comp,
                     "ratio": (t_gen + t_comp) / t_fwd if t_fwd > 0 else math.inf})
    return rows


def cuda_rows(only):
    from numba import cuda

    import kadj
    from kernels.cuda import all_cases
    rows = []
    for case in all_cases():
        if only and case.name not in only:
            continue
        args = case.make_args(np.random.default_rng(0))
        disp = case.kernel.dispatcher if hasattr(case.kernel, "dispatcher") else case.kernel
        k = kadj.differentiate(disp)
        sig = tuple(k._arg_types(k.complete_args(args)))
        try:
            t_fwd = _timed(lambda: cuda.compile_ptx(disp.py_func, sig, cc=(9, 0)))
            t_gen = _timed(lambda: k.adjoint_source(*args))
            t_comp = _timed(lambda: k.adjoint_ptx(*args, cc=(9, 0)))
        except Exception as exc:
            print(f"  {case.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        rows.append({"target": "cuda", "kernel": case.name, "forward_s": t_fwd,
                     "generate_s": t_gen, "compile_s": t_comp,
                     "ratio": (t_gen + t_comp) / t_fwd if t_fwd > 0 else math.inf})
    return rows


def limiter_rows(steps_list):
    """A long kernel (``kernels/long_kernels.py``: ``steps`` limited updates written
    out in one function) at each number of steps: the forward's compile, the adjoint's
    generation and compile (fresh dispatchers, no cache), and the adjoint's lines."""
    import kadj
    from kernels.long_kernels import limiter_kernel
    rows = []
    directory = tempfile.mkdtemp(dir=_SCRATCH)
    for steps in steps_list:
        kernel = limiter_kernel(steps, directory)
        u = np.random.default_rng(0).standard_normal(64)
        args = (u, np.zeros(64), 0.3)
        t_fwd = _cpu_forward(_Long(kernel), args)
        k = kadj.differentiate(_fresh_cpu(kernel))
        source = []
        t_gen = _timed(lambda: source.append(k.adjoint_source(*args)))
        t_comp = _timed(lambda: k.adjoint(*_copy(args), *_adjoint_buffers(k, args)))
        rows.append({"target": "cpu", "kernel": f"limiter_{steps}", "forward_s": t_fwd,
                     "generate_s": t_gen, "compile_s": t_comp,
                     "ratio": (t_gen + t_comp) / t_fwd if t_fwd > 0 else math.inf,
                     "lines": source[0].count("\n")})
    return rows


class _Long:
    def __init__(self, kernel):
        self.kernel = kernel


def _warm_up():
    """Compile what every process compiles once: numba's start-up and kadj's runtime
    helpers (a kernel whose adjoint records a tape)."""
    from numba import njit

    import kadj

    @kadj.differentiate
    @njit
    def warm(c, x, y):
        for i in range(x.shape[0]):
            acc = c[0]
            for k in range(1, c.shape[0]):
                acc = acc * x[i] + c[k]
            y[i] = acc

    c, x, y = np.ones(3), np.ones(4), np.zeros(4)
    warm.adjoint(c, x, y, np.zeros(3), np.zeros(4), np.ones(4))


def summary(rows):
    ratios = [r["ratio"] for r in rows if math.isfinite(r["ratio"]) and r["ratio"] > 0]
    if not ratios:
        return {}
    forward = sum(r["forward_s"] for r in rows)
    adjoint = sum(r["generate_s"] + r["compile_s"] for r in rows)
    return {"kernels": len(ratios), "median": statistics.median(ratios),
            "geomean": math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
            "max": max(ratios), "at_most_1_5": sum(x <= 1.5 for x in ratios),
            "summed": adjoint / forward if forward > 0 else math.inf}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuda", action="store_true", help="the CUDA gallery too (PTX)")
    p.add_argument("--cuda-only", action="store_true")
    p.add_argument("--only", nargs="*", default=None, help="kernel names")
    p.add_argument("--clock", choices=("wall", "process"), default="process")
    p.add_argument("--json", default=None, help="write the rows (of the last pass) to "
                   "this file")
    p.add_argument("--passes", type=int, default=1,
                   help="compile the gallery this many times in one process")
    p.add_argument("--limiter", type=int, nargs="*", default=None,
                   help="instead of the gallery: a long kernel of this many limited "
                        "updates written out (kernels/long_kernels.py), per number")
    p.add_argument("--repeat", type=int, default=1,
                   help="compile each CPU kernel's forward and adjoint this many times "
                        "in turn and keep the least time of each")
    opts = p.parse_args(argv)
    global _clock
    _clock = time.process_time if opts.clock == "process" else time.perf_counter
    _warm_up()
    if opts.limiter:
        rows = limiter_rows(opts.limiter)
        _print(rows)
        for r in rows:
            print(f"{r['kernel']}: {r['lines']} adjoint lines")
        if opts.json:
            pathlib.Path(opts.json).write_text(json.dumps(rows, indent=1))
        return
    only = set(opts.only or ())
    for number in range(1, opts.passes + 1):
        if number > 1:
            _fresh_cache()
        rows = [] if opts.cuda_only else cpu_rows(only, max(1, opts.repeat))
        if opts.cuda or opts.cuda_only:
            rows += cuda_rows(only)
        if opts.passes > 1:
            print(f"pass {number} of {opts.passes}:")
        _print(rows)
    if opts.json:
        pathlib.Path(opts.json).write_text(json.dumps(rows, indent=1))


def _print(rows):
    print(f"{'target':6} {'kernel':28} {'forward s':>10} {'generate s':>11} "
          f"{'compile s':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['target']:6} {r['kernel']:28} {r['forward_s']:10.3f} "
              f"{r['generate_s']:11.3f} {r['compile_s']:10.3f} {r['ratio']:7.2f}")
    for target in ("cpu", "cuda"):
        s = summary([r for r in rows if r["target"] == target])
        if s:
            print(f"{target}: {s['kernels']} kernels, (generate + compile) / forward "
                  f"compile: median {s['median']:.2f}x, geometric mean {s['geomean']:.2f}x, "
                  f"max {s['max']:.2f}x; {s['at_most_1_5']} at most 1.5x; summed over "
                  f"the kernels {s['summed']:.2f}x")


if __name__ == "__main__":
    main()
