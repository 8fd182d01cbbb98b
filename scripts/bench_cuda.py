"""Time kadj's CUDA adjoints against the forward kernels and hand-written adjoints.

For every case in ``perf/cases_cuda.py`` this times, on the GPU, the forward launch,
kadj's adjoint (``kernel.adjoint[grid, block]``) and the hand-written adjoint
(``case.hand[grid, block]``), each with CUDA events around the launch call (so kadj's
Python-side argument checks count, as they do for a user), as the minimum over
``--repeat`` calls after two warm-up calls (compilation happens in the first).  All
arrays are device arrays (``numba.cuda.to_device``); adjoint buffers are in/out, so
before every adjoint call they are refilled from the same seeds by a device-to-device
copy outside the timed region.  It then checks that kadj's adjoint agrees with the
hand-written one (``np.allclose`` after copying both back; the summation order of
atomics differs) and prints a table with adjoint/forward and kadj/hand ratios.

Usage::

    python scripts/bench_cuda.py                   # large sizes (~0.1-1 ms per forward)
    python scripts/bench_cuda.py --size small --repeat 50 --cases heat2d spmv
    python scripts/bench_cuda.py --json bench.json

Beside the ratios it reports:

- **memory bandwidth**: each launch's least DRAM traffic (the forward reads every
  argument array it does not write and writes the ones it writes; an adjoint reads the
  arrays the forward does not write, and reads and writes every adjoint buffer) divided
  by its time, as a fraction of the device's copy bandwidth, measured first with a
  plain copy kernel over 1 GiB (bytes read plus bytes written);
- **scatter vs gather**: kadj's scatter form (``kadj.differentiate(k, gather=False)``,
  atomics into neighbour arrays) beside its default, the gather form where the launch
  allows it;
- **block-reduced vs naive atomics**: where the case has one, the hand-written adjoint
  with the scalar's adjoint added by one atomic per thread (``case.naive``) beside the
  one that sums it over the block first.

Without a GPU (or under ``NUMBA_ENABLE_CUDASIM=1``) it prints ``no GPU: nothing
measured`` and exits 0, or 1 with ``--require-gpu``.  Exits 1 when kadj's adjoint fails
or disagrees with the hand-written one.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: perf/ and kadj/ live next to scripts/
    sys.path.insert(0, str(ROOT))

RTOL = 1e-9    # relative to the largest element of the hand-written result


def gpu_status():
    """(True, device name) when a real CUDA GPU is usable, else (False, why)."""
    try:
        from numba import config
        if getattr(config, "ENABLE_CUDASIM", False):
            return False, "NUMBA_ENABLE_CUDASIM is set (simulator)"
        from numba import cuda
        if not cuda.is_available():
            return False, "numba.cuda.is_available() is False"
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        return True, f"{name} (cc {dev.compute_capability[0]}.{dev.compute_capability[1]})"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


def time_call(call, repeat, refill=None):
    """Minimum over ``repeat`` calls of the CUDA-event time of ``call()`` in seconds;
    ``refill()`` runs before each call, untimed."""
    from numba import cuda

    start, end = cuda.event(), cuda.event()
    best = float("inf")
    for _ in range(repeat):
        if refill is not None:
            refill()
        cuda.synchronize()
        start.record()
        call()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)  # milliseconds
    return best


def _to_device(args):
    from numba import cuda
    return tuple(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args)


def compare(got, expected):
    """(max abs diff, max diff relative to the largest |expected|, allclose) over all
    adjoint buffers."""
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for g, e in zip(got, expected):
        scale = max(float(np.max(np.abs(e))), 1e-300)
        diff = float(np.max(np.abs(g - e)))
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / scale)
        ok &= bool(np.allclose(g, e, rtol=RTOL, atol=RTOL * scale))
    return worst_abs, worst_rel, ok


def copy_bandwidth(nbytes=1 << 30, repeat=10):
    """The device's copy bandwidth in bytes/s (bytes read plus bytes written) of a plain
    one-thread-per-element float64 copy kernel over ``nbytes``: the ceiling the
    bandwidth fractions are measured against."""
    from numba import cuda

    from perf.cases_cuda import copy

    n = nbytes // 8
    a = cuda.to_device(np.ones(n))
    b = cuda.device_array_like(a)
    config = ((n + 255) // 256, 256)
    copy[config](a, b)
    seconds = time_call(lambda: copy[config](a, b), repeat)
    return 2 * n * 8 / seconds


def least_traffic(case, args, seeds):
    """(forward bytes, adjoint bytes): the least DRAM traffic of one launch (see the
    module docstring)."""
    read = sum(a.nbytes for k, a in enumerate(args)
               if isinstance(a, np.ndarray) and k not in case.written)
    written = sum(args[k].nbytes for k in case.written)
    return read + written, read + 2 * sum(s.nbytes for s in seeds if s.size > 1)


def bench_case(case, size, repeat, seed=0):
    """Time one case; returns a dict of results (times in seconds)."""
    from numba import cuda

    import kadj
    from perf.cases_cuda import make_adjoints

    rng = np.random.default_rng(seed)
    n = case.size(size)
    args = case.make_args(n, rng)
    config = case.launch(args)
    seeds = make_adjoints(case, args, rng)
    d_args = _to_device(args)           # the pre-call state every adjoint call sees
    d_fwd = _to_device(args)            # the forward writes its outputs here
    d_seeds = _to_device(seeds)
    d_work = tuple(cuda.device_array_like(s) for s in seeds)

    def refill():
        for w, s in zip(d_work, d_seeds):
            w.copy_to_device(s)

    result = {"case": case.name, "n": n, "description": case.description,
              "grid": list(config[0]), "block": list(config[1])}
    result["bytes_fwd"], result["bytes_adj"] = least_traffic(case, args, seeds)

    def fwd():
        case.forward[config](*d_fwd)

    def launcher(adjoint):
        return lambda: adjoint[config](*d_args, *d_work)

    def outputs(call):
        refill()
        call()
        cuda.synchronize()
        return tuple(w.copy_to_host() for w in d_work)

    for _ in range(2):
        fwd()
    hand = launcher(case.hand)
    hand_out = outputs(hand)
    result["fwd"] = time_call(fwd, repeat)
    result["hand"] = time_call(hand, repeat, refill)
    if case.naive is not None:
        naive = launcher(case.naive)
        result["naive_allclose"] = compare(outputs(naive), hand_out)[2]
        result["hand_naive"] = time_call(naive, repeat, refill)
    try:
        kadj_adj = launcher(case.kernel.adjoint)
        result["max_abs_diff"], result["max_rel_diff"], result["allclose"] = compare(
            outputs(kadj_adj), hand_out)
        for d, a in zip(d_args, args):
            if isinstance(a, np.ndarray) and not np.array_equal(d.copy_to_host(), a):
                raise AssertionError("kadj's adjoint modified a forward argument")
        result["kadj"] = time_call(kadj_adj, repeat, refill)
        report = case.kernel.adjoint_report(*args)
        result["kadj_atomics"] = report.get("atomics")
        result["kadj_form"] = "gather" if report["gather"].get("used") else "scatter"
        if result["kadj_form"] == "gather":
            scatter = launcher(kadj.differentiate(case.forward, gather=False).adjoint)
            result["scatter_allclose"] = compare(outputs(scatter), hand_out)[2]
            result["kadj_scatter"] = time_call(scatter, repeat, refill)
    except Exception:
        result["error"] = traceback.format_exc()
    return result


def _fmt(seconds, unit):
    return f"{seconds * {'ms': 1e3, 'us': 1e6}[unit]:9.3f}"


def print_table(results, size, repeat, device, ceiling):
    unit = "ms" if max(r["fwd"] for r in results) >= 1e-3 else "us"
    print(f"\nkadj CUDA benchmarks on {device}: size={size}, min of {repeat} launches "
          f"(CUDA events), times in {unit}\n")
    header = (f"{'case':<8} {'n':>9} {'forward':>9} {'hand adj':>9} {'kadj adj':>9}"
              f" {'hand/fwd':>8} {'kadj/fwd':>8} {'kadj/hand':>9}  {'max diff':>9}"
              f" {'rel diff':>9}")
    print(header)
    print("-" * len(header))
    for r in results:
        line = (f"{r['case']:<8} {r['n']:>9} {_fmt(r['fwd'], unit)} {_fmt(r['hand'], unit)} "
                f"{_fmt(r['kadj'], unit) if 'kadj' in r else '-':>9}"
                f" {r['hand'] / r['fwd']:7.2f}x")
        if "kadj" in r:
            line += (f" {r['kadj'] / r['fwd']:7.2f}x {r['kadj'] / r['hand']:8.2f}x"
                     f"  {r['max_abs_diff']:9.2e} {r['max_rel_diff']:9.2e}")
            if not r["allclose"]:
                line += "  MISMATCH"
        else:
            line += f" {'-':>8} {'-':>9}  {'-':>9} {'-':>9}  kadj FAILED"
        print(line)
    print()
    print(f"memory bandwidth: least traffic / time, as a fraction of the copy kernel's "
          f"{ceiling / 1e12:.2f} TB/s (read + written)\n")
    header = (f"{'case':<8} {'fwd MB':>9} {'adj MB':>9} {'forward':>8} {'hand adj':>8}"
              f" {'kadj adj':>8}  {'kadj form':<9} {'scatter':>9} {'scat/gath':>9}"
              f" {'naive/block':>11}")
    print(header)
    print("-" * len(header))

    def frac(nbytes, seconds):
        return f"{nbytes / seconds / ceiling:7.0%}"

    for r in results:
        line = (f"{r['case']:<8} {r['bytes_fwd'] / 1e6:9.1f} {r['bytes_adj'] / 1e6:9.1f}"
                f" {frac(r['bytes_fwd'], r['fwd']):>8} {frac(r['bytes_adj'], r['hand']):>8}"
                f" {frac(r['bytes_adj'], r['kadj']) if 'kadj' in r else '-':>8}"
                f"  {r.get('kadj_form', '-'):<9}")
        if "kadj_scatter" in r:
            line += (f" {_fmt(r['kadj_scatter'], unit)} "
                     f"{r['kadj_scatter'] / r['kadj']:8.2f}x")
            if not r["scatter_allclose"]:
                line += " MISMATCH"
        else:
            line += f" {'-':>9} {'-':>9}"
        if "hand_naive" in r:
            line += f" {r['hand_naive'] / r['hand']:10.2f}x"
            if not r["naive_allclose"]:
                line += " MISMATCH"
        else:
            line += f" {'-':>11}"
        print(line)
    print()
    for r in results:
        print(f"  {r['case']:<8} {r['description']}; grid {tuple(r['grid'])}, "
              f"block {tuple(r['block'])}")
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("small", "large"), default="large")
    parser.add_argument("--repeat", type=int, default=20, help="timed launches per measurement")
    parser.add_argument("--cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--require-gpu", action="store_true",
                        help="exit with status 1 when no GPU is present")
    opts = parser.parse_args(argv)

    ok, device = gpu_status()
    if not ok:
        print(f"no GPU: nothing measured ({device})")
        return 1 if opts.require_gpu else 0

    from perf.cases_cuda import CASES

    cases = CASES
    if opts.cases:
        known = {c.name: c for c in CASES}
        unknown = [name for name in opts.cases if name not in known]
        if unknown:
            parser.error(f"unknown case(s) {unknown}; known: {sorted(known)}")
        cases = tuple(known[name] for name in opts.cases)

    ceiling = copy_bandwidth()
    results, failed = [], False
    for case in cases:
        r = bench_case(case, opts.size, max(1, opts.repeat))
        results.append(r)
        if "error" in r:
            failed = True
            print(f"kadj failed on case {case.name}:\n{r['error']}", file=sys.stderr)
        elif not (r["allclose"] and r.get("scatter_allclose", True)
                  and r.get("naive_allclose", True)):
            failed = True
    print_table(results, opts.size, opts.repeat, device, ceiling)
    if opts.json:
        Path(opts.json).write_text(json.dumps(
            {"device": device, "size": opts.size, "repeat": opts.repeat,
             "copy_bandwidth_bytes_per_s": ceiling,
             "statistic": "min", "python": platform.python_version(),
             "results": results}, indent=2))
        print(f"wrote {opts.json}")
    if failed:
        print("FAILED: kadj's adjoint failed or disagrees with the hand-written adjoint")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
