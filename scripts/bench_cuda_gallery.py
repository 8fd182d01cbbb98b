"""Every CUDA gallery kernel on a GPU: its gradient checked at a large size, and its
adjoint timed against its forward.

For every case of ``kernels/cuda`` (``kernels.cuda.all_cases()``, each with
``sized(rng, n)``):

1. **gradient at scale**: :func:`kadj.testing.check_grad_cuda` on the GPU at about
   ``--check-n`` elements (default 65,536: the launch has hundreds of blocks, where the
   simulator's checks have a few), against float64 central differences;
2. **adjoint / forward**: at about ``--n`` elements (default 2**22), the plain forward
   kernel (``case.kernel.dispatcher``) and kadj's adjoint (``case.kernel.adjoint``, in
   the form kadj picks for the launch), each timed with CUDA events around the launch
   call, the minimum over ``--repeat`` calls after a warm-up (compilation happens
   there); before every call the arguments and adjoint buffers are refilled from
   pristine device copies, outside the timed region.

Prints one line per case as it finishes, then a table and the median ratio; ``--json``
writes the records.  ``--budget`` seconds (default 240) bounds the run: cases not
started by then are listed as skipped for time.  Without a GPU (or under
``NUMBA_ENABLE_CUDASIM=1``) it prints ``no GPU: nothing measured`` and exits 0, or 1
with ``--require-gpu``.  Exits 1 when a gradient check fails or an adjoint raises.

Usage::

    python scripts/bench_cuda_gallery.py
    python scripts/bench_cuda_gallery.py --only heat2d_step spmv_csr --n 16777216
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: kernels/ and kadj/ live here
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cuda import gpu_status, time_call  # noqa: E402
from perf.cases_cuda import make_adjoints  # noqa: E402


def check_case(case, n, seed=0):
    """Gradient check on the GPU at about ``n`` elements: (max relative error, seconds)."""
    from kadj.testing import check_grad_cuda

    start = time.perf_counter()
    config, args = case.sized(np.random.default_rng(seed), n)
    result = check_grad_cuda(case.kernel, config, args, rtol=case.rtol, seed=seed)
    return result.max_rel_error, time.perf_counter() - start


def time_case(case, n, repeat, seed=0):
    """(forward seconds, adjoint seconds, elements, grid, block) at about ``n``."""
    from numba import cuda

    rng = np.random.default_rng(seed)
    config, args = case.sized(rng, n)
    plan = case.kernel.adjoint_plan(*args)
    seeds = make_adjoints(plan, args, rng)     # (the plan has the adjoint slots)

    def dev(xs):
        return [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in xs]

    pristine, work = dev(args), dev(args)
    d_seeds, d_adj = dev(seeds), dev(seeds)

    def refill():
        for w, p in zip(work, pristine):
            if hasattr(w, "copy_to_device"):
                w.copy_to_device(p)
        for w, s in zip(d_adj, d_seeds):
            w.copy_to_device(s)

    forward = case.kernel.dispatcher[config]
    adjoint = case.kernel.adjoint[config]
    refill()
    forward(*work)                      # compile outside the timing
    refill()
    adjoint(*work, *d_adj)
    cuda.synchronize()
    t_fwd = time_call(lambda: forward(*work), repeat, refill)
    t_adj = time_call(lambda: adjoint(*work, *d_adj), repeat, refill)
    size = max((a.size for a in args if isinstance(a, np.ndarray)), default=0)
    return t_fwd, t_adj, size, config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1 << 22, help="elements for timing")
    parser.add_argument("--check-n", type=int, default=1 << 16,
                        help="elements for the gradient check (0: no check)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--budget", type=float, default=240.0,
                        help="seconds after which no new case is started")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--json", metavar="FILE", help="write the records as JSON")
    parser.add_argument("--require-gpu", action="store_true")
    opts = parser.parse_args(argv)

    ok, device = gpu_status()
    if not ok:
        print(f"no GPU: nothing measured ({device})")
        return 1 if opts.require_gpu else 0

    from kernels.cuda import all_cases

    cases = [c for c in all_cases() if c.sized is not None]
    if opts.only:
        known = {c.name for c in cases}
        unknown = sorted(set(opts.only) - known)
        if unknown:
            parser.error(f"unknown case(s) {unknown}")
        cases = [c for c in cases if c.name in opts.only]

    start, records, failed = time.perf_counter(), [], False
    for case in cases:
        rec = {"case": case.name}
        records.append(rec)
        if time.perf_counter() - start > opts.budget:
            rec["skipped"] = "time budget spent"
            continue
        try:
            if opts.check_n:
                rec["check_rel_error"], rec["check_s"] = check_case(case, opts.check_n)
                rec["check_n"] = opts.check_n
            t_fwd, t_adj, size, config = time_case(case, opts.n, opts.repeat)
            rec.update(fwd=t_fwd, adj=t_adj, ratio=t_adj / t_fwd, elements=size,
                       grid=str(config[0]), block=str(config[1]))
            print(f"{case.name:<28} check {rec.get('check_rel_error', float('nan')):8.1e}"
                  f"  fwd {t_fwd * 1e6:9.1f} us  adj {t_adj * 1e6:9.1f} us"
                  f"  adj/fwd {t_adj / t_fwd:6.2f}x", flush=True)
        except Exception as exc:
            failed = True
            rec["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{case.name:<28} FAILED {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()

    print(f"\nkadj CUDA gallery on {device}: gradient checked at about {opts.check_n} "
          f"elements; timed at about {opts.n} elements, min of {opts.repeat} launches "
          f"(CUDA events)\n")
    print(f"{'case':<28} {'elements':>10} {'check err':>9} {'forward us':>11} "
          f"{'adjoint us':>11} {'adj/fwd':>8}")
    for rec in records:
        if "ratio" in rec:
            print(f"{rec['case']:<28} {rec['elements']:>10} "
                  f"{rec.get('check_rel_error', float('nan')):9.1e} "
                  f"{rec['fwd'] * 1e6:11.1f} {rec['adj'] * 1e6:11.1f} {rec['ratio']:7.2f}x")
        else:
            print(f"{rec['case']:<28} {rec.get('error') or rec.get('skipped')}")
    ratios = [r["ratio"] for r in records if "ratio" in r]
    if ratios:
        print(f"\nadjoint/forward over {len(ratios)} kernels: median "
              f"{statistics.median(ratios):.2f}x, min {min(ratios):.2f}x, "
              f"max {max(ratios):.2f}x")
    if opts.json:
        Path(opts.json).write_text(json.dumps(
            {"device": device, "n": opts.n, "check_n": opts.check_n,
             "repeat": opts.repeat, "statistic": "min", "records": records}, indent=2))
        print(f"wrote {opts.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
