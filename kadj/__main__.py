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
    an ``@njit`` or a ``@cuda.jit`` one (no GPU needed); a CUDA kernel's adjoint is
    printed in every form (scatter, gather), each labelled (:mod:`kadj.cli_show`).

``python -m kadj report MODULE:FUNC --args EXPR [--json] [--baseline FILE]``
    Prints the kernel's cost card (:mod:`kadj.cost_card`): adjoint lines, tape use,
    accumulation per argument, atomics in the PTX, adjoint/forward time; compares it
    with a saved card for CI (:mod:`kadj.cli_report`).
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kadj", description="kadj: adjoints of Numba kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    from .demo import cli as demo_cli
    p = sub.add_parser("demo", help=demo_cli.HELP)
    demo_cli.add_arguments(p)
    p.set_defaults(run=demo_cli.run)

    from . import cli_report, cli_show
    cli_show.add_parser(sub)
    cli_report.add_parser(sub)

    opts = parser.parse_args(argv)
    return opts.run(opts)


if __name__ == "__main__":
    sys.exit(main())
