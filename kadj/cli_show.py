"""``python -m kadj show MODULE:KERNEL --args EXPR [--stage STAGE] [--form FORM]``.

Prints the adjoint kadj generates for a kernel, or one stage of the pipeline.  A CUDA
kernel's adjoint is printed in every form it has, each under a ``# ---- FORM ----``
label: ``scatter`` (the adjoint kernel with atomics), then, when the kernel has a
gather form, ``gather`` and ``zero`` (its two kernels); ``--form`` picks one.  Errors
(no such module or file, no such kernel, not a kernel, bad ``--args``, a kernel kadj
refuses) are one sentence on stderr, exit status 2.
"""
from __future__ import annotations

import sys

from .cli_target import CliError, explained, kernel_and_args

STAGES = ("typed", "region", "plan", "prepared", "facts", "adjoint-ir", "source",
          "tangent")
FORMS = ("all", "scatter", "gather", "zero")


def add_parser(sub):
    p = sub.add_parser("show", help="print the adjoint kadj generates for a kernel")
    p.add_argument("target", metavar="MODULE:KERNEL",
                   help="a dotted module name or a path to a .py file, ':', a kernel")
    p.add_argument("--args", help="example arguments, a Python expression (np in scope)")
    p.add_argument("--wrt", help="comma-separated inputs to differentiate (default: all "
                                 "floats)")
    p.add_argument("--stage", choices=STAGES,
                   help="print this stage of the pipeline instead of the adjoint")
    p.add_argument("--form", choices=FORMS, default="all",
                   help="a CUDA kernel's adjoint form to print (default: every form)")
    p.set_defaults(run=run)
    return p


def cuda_forms(kernel, args):
    """[(label, source)] of a CUDA kernel's adjoint forms, and why it has no gather
    form (None when it has one)."""
    comp = kernel.compiled(*args)
    forms = [("scatter", comp.source)]
    if comp.gather is None:
        why = comp.report.get("gather", {}).get("why", "")
        return forms, str(why) or "no reason given"
    forms += [("gather", comp.gather.sources[0]), ("zero", comp.gather.sources[1])]
    return forms, None


def _adjoint_text(kernel, args, form):
    if getattr(kernel, "target_name", "cpu") != "cuda":
        if form not in ("all", "scatter"):
            raise CliError(f"--form {form} applies to CUDA kernels only; "
                           f"{kernel.__name__!r} is a CPU kernel")
        return kernel.adjoint_source(*args) + "\n"
    forms, why = cuda_forms(kernel, args)
    if form != "all":
        chosen = [(label, src) for label, src in forms if label == form]
        if not chosen:
            raise CliError(f"{kernel.__name__!r} has no {form} form: {why}")
        return chosen[0][1] + "\n"
    text = "".join(f"# ---- {label} ----\n{src}\n" for label, src in forms)
    if why is not None:
        text += f"# no gather form: {why}\n"
    return text


def run(opts):
    try:
        kernel, args = kernel_and_args(
            opts, example=', such as --args "np.zeros(8), np.zeros(8), 0.1"')
        text = explained(kernel, lambda: kernel.show_stage(opts.stage, *args)
                         if opts.stage else _adjoint_text(kernel, args, opts.form))
    except CliError as exc:
        print(f"kadj show: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
