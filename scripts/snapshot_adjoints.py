"""Write the generated adjoint of every gallery kernel (CPU, and CUDA in every form)
into a directory, one file per kernel and form, with the CUDA adjoint reports, and the
seconds each took to generate and compile.  Two snapshots of different versions of kadj
compare with ``diff -r``: a refactoring of the code generator that must not change the
generated code shows an empty diff.

    python scripts/snapshot_adjoints.py OUT_DIR [--cpu-only|--cuda-only] [--times]
                                        [--compile] [--ptx] [--clock wall|process]

``--times`` writes times.json: the seconds each kernel's adjoint took to generate (CPU:
and, with ``--compile``, to compile with numba as well, by running it once; CUDA: and,
with ``--ptx``, to compile the adjoint to PTX with ``numba.cuda.compile_ptx``, which
needs numba-cuda's compiler but no GPU, and not ``NUMBA_ENABLE_CUDASIM=1``).
``--clock process`` counts the CPU seconds of this process instead of wall-clock
seconds: steadier on a machine that other work shares.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

_clock = time.perf_counter

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _run_adjoint(k, args):
    """Run the adjoint once (zero cotangents): numba compiles it."""
    plan = k.adjoint_plan(*args)
    adjs = [np.zeros_like(args[i]) if isinstance(args[i], np.ndarray) else np.zeros(1)
            for i in plan.adjoint_args]
    k.adjoint(*args, *adjs)


def cpu(out, times, compile_too=False):
    import kadj
    from kernels.cpu import GALLERY
    for ex in GALLERY:
        k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
        args = ex.make_args(np.random.default_rng(0))
        t0 = _clock()
        try:
            src = k.adjoint_source(*args)
            if compile_too:
                _run_adjoint(k, args)
        except Exception as exc:  # a refusal is part of the snapshot
            src = f"REFUSED {type(exc).__name__}: {exc}\n"
        times[f"cpu/{ex.name}"] = _clock() - t0
        (out / f"cpu__{ex.name}.py.txt").write_text(src)


def cuda(out, times, ptx=False):
    from kernels.cuda import all_cases
    for case in all_cases():
        k = case.kernel
        args = case.make_args(np.random.default_rng(0))
        t0 = _clock()
        try:
            src = k.adjoint_source(*args)
            report = k.adjoint_report(*args)
            if ptx:
                k.adjoint_ptx(*args)
        except Exception as exc:
            src, report = f"REFUSED {type(exc).__name__}: {exc}\n", None
        times[f"cuda/{case.name}"] = _clock() - t0
        (out / f"cuda__{case.name}.py.txt").write_text(src)
        if report is not None:
            (out / f"cuda__{case.name}.report.json").write_text(
                json.dumps(report, indent=1, sort_keys=True, default=str))
            for form in ("gather", "zero"):
                if report.get("gather", {}).get("used"):
                    (out / f"cuda__{case.name}.{form}.py.txt").write_text(
                        k.adjoint_source(*args, form=form))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--cpu-only", action="store_true")
    p.add_argument("--cuda-only", action="store_true")
    p.add_argument("--times", action="store_true",
                   help="also write times.json: seconds to generate each adjoint")
    p.add_argument("--compile", action="store_true",
                   help="CPU adjoints: also compile them (run once) inside the timing")
    p.add_argument("--ptx", action="store_true",
                   help="CUDA adjoints: also compile them to PTX inside the timing")
    p.add_argument("--clock", choices=("wall", "process"), default="wall",
                   help="wall-clock seconds (default) or this process's CPU seconds")
    opts = p.parse_args(argv)
    global _clock
    _clock = time.process_time if opts.clock == "process" else time.perf_counter
    out = pathlib.Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    if not opts.cuda_only:
        cpu(out, times, opts.compile)
    if not opts.cpu_only:
        cuda(out, times, opts.ptx)
    if opts.times:
        (out / "times.json").write_text(json.dumps(times, indent=1, sort_keys=True))
    print(f"{len(times)} kernels in {sum(times.values()):.1f} s -> {out}")


if __name__ == "__main__":
    main()
