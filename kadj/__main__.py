"""kadj's command line.

``python -m kadj demo``
    Solves an inverse problem end to end (:mod:`kadj.demo`): recovers the diffusivity
    field of a 2-D heat equation from a noisy final temperature by L-BFGS on kadj
    gradients (a :class:`kadj.Tape` over :func:`kadj.checkpointed_loop`), on the GPU
    when one is present, else on the CPU.  It prints a summary (with a finite-difference
    check of one gradient: exit status 1 when it fails) and writes ``kadj-demo.png``.
    ``python -m kadj demo --help`` lists the options (size, steps, device, output,
    ``--quick``).

``python -m kadj show MODULE:FUNC --args EXPR``
    Prints the adjoint kadj generates for a kernel.  ``MODULE`` is a dotted module name
    (importable from the current directory) or a path to a ``.py`` file; ``FUNC`` is an
    ``@njit`` kernel or a ``kadj.differentiate``-d one.  ``EXPR`` is a Python expression
    for example arguments, evaluated with ``np`` (NumPy) in scope, for instance
    ``--args "np.zeros(8), np.zeros(8), 0.1"``.

``python -m kadj show MODULE:FUNC --args EXPR --stage STAGE``
    Prints one stage of the pipeline (:mod:`kadj.pipeline`) instead of the adjoint:
    ``typed`` (numba's typed IR), ``region`` (the region tree: structured loops and
    ifs), ``plan`` (the adjoint's argument layout), ``prepared`` (the region tree after
    the target's rewrites, and the analysis policy), ``facts`` (what the analysis found:
    active values, what each reversed loop records, recomputes or replays),
    ``adjoint-ir`` (the adjoint IR of every form of the adjoint, before printing),
    ``source`` (every form of the adjoint, without the disk cache) or ``tangent`` (the
    forward-mode function ``kernel.jvp`` runs).  The kernel may be
    an ``@njit`` or a ``@cuda.jit`` one (no GPU needed).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

import numpy as np


# --------------------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------------------


def _load(target):
    module_name, sep, func_name = target.rpartition(":")
    if not sep or not module_name or not func_name:
        raise SystemExit(f"kadj show: expected MODULE:FUNC, got {target!r}")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None:
            raise SystemExit(f"kadj show: cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    try:
        obj = module
        for part in func_name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise SystemExit(f"kadj show: {module_name} has no attribute {func_name!r}") from None
    return obj


def show(opts):
    import kadj

    kernel = _load(opts.target)
    wrt = tuple(w for w in opts.wrt.split(",") if w) if opts.wrt else None
    if not hasattr(kernel, "adjoint_source"):
        kernel = kadj.differentiate(kernel, wrt=wrt)
    elif wrt is not None:
        raise SystemExit("kadj show: --wrt applies only to a kernel not yet differentiated")
    args = ()
    if opts.args:
        args = eval(opts.args, {"np": np, "numpy": np})  # a command-line expression
        if not isinstance(args, tuple):
            args = (args,)
    try:
        if opts.stage:
            print(kernel.show_stage(opts.stage, *args), end="")
        else:
            print(kernel.adjoint_source(*args))
    except kadj.DifferentiationError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kadj", description="kadj: adjoints of Numba kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    from .demo import cli as demo_cli
    p = sub.add_parser("demo", help=demo_cli.HELP)
    demo_cli.add_arguments(p)
    p.set_defaults(run=demo_cli.run)

    p = sub.add_parser("show", help="print the adjoint kadj generates for a kernel")
    p.add_argument("target", metavar="MODULE:FUNC")
    p.add_argument("--args", help="example arguments, a Python expression (np in scope)")
    p.add_argument("--wrt", help="comma-separated inputs to differentiate (default: all floats)")
    p.add_argument("--stage", choices=("typed", "region", "plan", "prepared", "facts",
                                       "adjoint-ir", "source", "tangent"),
                   help="print this stage of the pipeline instead of the adjoint")
    p.set_defaults(run=show)

    opts = parser.parse_args(argv)
    return opts.run(opts)


if __name__ == "__main__":
    sys.exit(main())
