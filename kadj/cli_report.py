"""``python -m kadj report MODULE:KERNEL --args EXPR [--json] [--baseline FILE]``.

Prints a kernel's cost card (:mod:`kadj.cost_card`) as a table, or as JSON with
``--json`` (save it to compare later).  With ``--baseline FILE`` (a card saved by
``--json``) it also compares: exit status 1, naming what regressed, when adjoint/forward
grew beyond ``--threshold`` times the baseline's (default 1.25), atomics or tape bytes
grew, or an accumulation got dearer; 0 otherwise.  Command-line errors are one sentence
on stderr, exit status 2.
"""
from __future__ import annotations

import json
import sys

from .cli_target import CliError, explained, kernel_and_args, parse_launch


def add_parser(sub):
    p = sub.add_parser("report", help="print a kernel's cost card (adjoint cost, memory, "
                                      "atomics); compare with a baseline")
    p.add_argument("target", metavar="MODULE:KERNEL",
                   help="a dotted module name or a path to a .py file, ':', a kernel")
    p.add_argument("--args", help="example arguments, a Python expression (np in scope)")
    p.add_argument("--wrt", help="comma-separated inputs to differentiate (default: all "
                                 "floats)")
    p.add_argument("--launch", metavar="GRID,BLOCK",
                   help="a CUDA kernel's launch, for its timing on a GPU")
    p.add_argument("--repeat", type=int, default=5, help="timed calls (median)")
    p.add_argument("--no-timing", action="store_true", help="leave the timing out")
    p.add_argument("--json", action="store_true", help="print the card as JSON")
    p.add_argument("--baseline", metavar="FILE", help="a card saved with --json to "
                                                     "compare with (exit 1 on a regression)")
    p.add_argument("--threshold", type=float, default=1.25,
                   help="adjoint/forward may grow by this factor (default 1.25)")
    p.set_defaults(run=run)
    return p


def _load_baseline(path):
    try:
        with open(path) as f:
            base = json.load(f)
    except OSError as exc:
        raise CliError(f"cannot read the baseline {path!r} ({exc.strerror})") from None
    except ValueError:
        raise CliError(f"the baseline {path!r} is not JSON: save one with "
                       "`python -m kadj report ... --json > FILE`") from None
    if not isinstance(base, dict) or "accumulation" not in base:
        raise CliError(f"the baseline {path!r} is not a cost card saved with --json")
    return base


def run(opts):
    from . import cost_card
    try:
        if opts.repeat < 1:
            raise CliError(f"--repeat must be at least 1, not {opts.repeat}")
        kernel, args = kernel_and_args(opts)
        config = parse_launch(opts.launch) if opts.launch else None
        base = _load_baseline(opts.baseline) if opts.baseline else None
        card = explained(kernel, lambda: cost_card.build(kernel, args, config, opts.repeat,
                                                         timing=not opts.no_timing))
    except CliError as exc:
        print(f"kadj report: {exc}", file=sys.stderr)
        return 2
    if opts.json:
        print(json.dumps(card, indent=2, sort_keys=True))
    else:
        sys.stdout.write(cost_card.to_table(card))
    if base is None:
        return 0
    if base.get("kernel") != card["kernel"]:
        print(f"kadj report: note: the baseline is a card of {base.get('kernel')!r}, "
              f"not of {card['kernel']!r}", file=sys.stderr)
    found = cost_card.regressions(card, base, opts.threshold)
    if found:
        print(f"kadj report: {len(found)} regression(s) against {opts.baseline}:",
              file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"kadj report: no regression against {opts.baseline} "
          f"(threshold {opts.threshold:g}x)", file=sys.stderr)
    return 0
