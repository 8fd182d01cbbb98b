"""Row kernels written in place against their out-of-place twins: adjoint/forward on one
CPU thread, all variants timed in one interleaved run.

Cases (gallery kernels, ``kernels/cpu``):

- ``softmax``: a per-row softmax written over the row in place
  (``softmax_rows_inplace``) and into another matrix (``softmax_rows``);
- ``thomas``: batched Thomas solves whose sweeps share two scratch rows
  (``thomas_batched``) and the same with scratch rows per system
  (``thomas_batched_private``).

Each variant's forward and kadj adjoint are timed, the calls taking turns
(:func:`kadj.timing.interleaved_times`); inputs and adjoint buffers are refilled outside
the timing.  The adjoint is timed as compiled from its source (``adjoint_source``,
``numba.njit`` with kadj's options), the same way as a saved one, without the checks of
a ``kernel.adjoint`` call (a few microseconds).  ``--before DIR`` also times adjoint sources saved by ``--dump DIR``
(from another version of kadj: ``--kadj-path`` imports kadj from that checkout), in the
same run, so a change's before/after ratios come from one measurement::

    python scripts/bench_rows.py --dump /tmp/before --kadj-path /path/to/old/checkout
    NUMBA_NUM_THREADS=1 python scripts/bench_rows.py --before /tmp/before

Each adjoint is checked against ``kernel.adjoint``'s result; the script exits with
status 1 on a disagreement.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _cases(rows, cols, systems, unknowns):
    from kernels.cpu.recurrences import (thomas_batched, thomas_batched_private,
                                         thomas_batched_shaped)
    from kernels.cpu.reductions import softmax_rows, softmax_rows_inplace, softmax_rows_shaped
    rng = np.random.default_rng(0)
    x = softmax_rows_shaped(rng, rows, cols)
    t = thomas_batched_shaped(rng, systems, unknowns)
    return [
        ("softmax", f"{rows} x {cols}", [("in place", softmax_rows_inplace, (x.copy(),)),
                                         ("out of place", softmax_rows,
                                          (x.copy(), np.zeros_like(x)))]),
        ("thomas", f"{systems} systems of {unknowns}",
         [("shared scratch rows", thomas_batched, t),
          ("scratch rows per system", thomas_batched_private, t)]),
    ]


def _adjoint_name(kernel):
    return getattr(kernel, "__name__", "kernel")


def dump(out, cases):
    """Write each variant's adjoint source (this kadj's) into ``out``."""
    import kadj
    out.mkdir(parents=True, exist_ok=True)
    for _, _, variants in cases:
        for _, kernel, args in variants:
            src = kadj.differentiate(kernel).adjoint_source(*args)
            (out / f"{_adjoint_name(kernel)}.py").write_text(src)
            print(f"wrote {out / (_adjoint_name(kernel) + '.py')} ({kadj.__file__})")


def _compile_saved(path, name):
    """The adjoint saved in ``path``, compiled as kadj compiles its CPU adjoints."""
    from numba import njit
    ns = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return _with_kept_memory(njit(error_model="numpy")(ns[f"{name}_adjoint"]))


def _with_kept_memory(fn):
    """``fn`` called as kadj calls a compiled adjoint: with the memory it keeps from one
    call to the next (:mod:`kadj.call_memory`) after its own arguments."""
    from kadj import call_memory
    memory = call_memory.for_function(fn.py_func)
    if memory is None:
        return fn

    def call(*args):
        kept = memory.take()
        try:
            return fn(*args, *kept.args)
        finally:
            memory.give(kept)
    return call


def _buffers(args, rng):
    return tuple(rng.standard_normal(a.shape) for a in args)


def bench(cases, repeat, before=None, clock=time.thread_time):
    import kadj
    from kadj.timing import interleaved_times
    rows, failed = [], False
    for case, size, variants in cases:
        calls, meta = {}, []
        for label, kernel, args in variants:
            seeds = _buffers(args, np.random.default_rng(1))
            work = tuple(np.empty_like(s) for s in seeds)
            fargs = tuple(a.copy() for a in args)

            def refill(work=work, seeds=seeds):
                for w, s in zip(work, seeds):
                    np.copyto(w, s)

            def frefill(fargs=fargs, args=args):
                for f, a in zip(fargs, args):
                    np.copyto(f, a)

            # the current adjoint timed as compiled from its source, like the saved
            # one (without kadj's argument checks: the same call either way); kadj's
            # own call gives the reference values
            k = kadj.differentiate(kernel)
            tmp = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / \
                f"kadj_bench_rows_{os.getpid()}_{_adjoint_name(kernel)}.py"
            tmp.write_text(k.adjoint_source(*args))
            adjoints = [("kadj", k.adjoint),
                        ("after", _compile_saved(tmp, _adjoint_name(kernel)))]
            tmp.unlink()
            saved = before / f"{_adjoint_name(kernel)}.py" if before else None
            if saved is not None and saved.exists():
                adjoints.append(("before", _compile_saved(saved, _adjoint_name(kernel))))
            kernel(*fargs)
            calls[(label, "forward")] = (lambda k=kernel, f=fargs: k(*f), frefill)
            reference = None
            for which, adj in adjoints:
                refill()
                adj(*args, *work)                       # compiles; then checked
                got = tuple(w.copy() for w in work)
                if reference is None:
                    reference = got
                else:
                    err = max(float(np.max(np.abs(g - r))) / max(float(np.max(np.abs(r))),
                                                                 1e-300)
                              for g, r in zip(got, reference))
                    if err > 1e-9:
                        failed = True
                        print(f"{case} {label}: the {which} adjoint disagrees ({err:.2e})",
                              file=sys.stderr)
                if which != "kadj":
                    calls[(label, which)] = (lambda a=adj, w=work, x=args: a(*x, *w),
                                             refill)
            meta.append((label, [w for w, _ in adjoints if w != "kadj"]))
        t = interleaved_times(calls, repeat, min, clock)
        for label, whiches in meta:
            fwd = t[(label, "forward")]
            rows.append((case, size, label, fwd,
                         {w: t[(label, w)] / fwd for w in whiches}))
    return rows, failed


def table(rows, repeat):
    print(f"\nadjoint / forward, minimum of {repeat} interleaved calls, one thread\n")
    has_before = any("before" in r[4] for r in rows)
    head = "| case | size | variant | forward | adjoint/forward" + \
        (" before | after |" if has_before else " |")
    print(head)
    print("|---|---|---|---:|---:|" + ("---:|" if has_before else ""))
    for case, size, label, fwd, ratio in rows:
        line = f"| {case} | {size} | {label} | {fwd * 1e3:.2f} ms |"
        if has_before:
            b = ratio.get("before")
            line += (f" {b:.2f}x |" if b is not None else " - |")
        line += f" {ratio['after']:.2f}x |"
        print(line)
    print()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=256)
    p.add_argument("--systems", type=int, default=20000)
    p.add_argument("--unknowns", type=int, default=64)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="CPU time of the calling thread (default) or wall time")
    p.add_argument("--before", type=pathlib.Path,
                   help="also time the adjoint sources saved in this folder by --dump")
    p.add_argument("--dump", type=pathlib.Path,
                   help="save the adjoint sources into this folder, time nothing")
    p.add_argument("--kadj-path", type=pathlib.Path,
                   help="import kadj from this checkout (with --dump)")
    opts = p.parse_args(argv)
    if opts.kadj_path is not None:
        sys.path.insert(0, str(opts.kadj_path.resolve()))
    sys.path.insert(1 if opts.kadj_path is not None else 0, str(ROOT))
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    cases = _cases(opts.rows, opts.cols, opts.systems, opts.unknowns)
    if opts.dump is not None:
        dump(opts.dump, cases)
        return 0
    clock = time.thread_time if opts.clock == "cpu" else time.perf_counter
    rows, failed = bench(cases, opts.repeat, opts.before, clock)
    table(rows, opts.repeat)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
