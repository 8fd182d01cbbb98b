"""Size-swept gradient checks of the CUDA gallery (kernels/cuda) in the CUDA simulator.

Run by tests/test_size_sweep_cuda.py in a subprocess with NUMBA_ENABLE_CUDASIM=1 set
before numba is imported::

    NUMBA_ENABLE_CUDASIM=1 python tests/size_sweep_cuda_sim.py stencils [case ...]
    NUMBA_ENABLE_CUDASIM=1 python tests/size_sweep_cuda_sim.py trips [case ...]

A gallery module name checks each of its cases at every size of ``SIZES``
(``Case.sized``: 1-D launches mostly of 32-thread blocks, so every size but 64 leaves
the last block partial, and 2-D / 3-D grids with partial blocks along each axis).
``trips`` checks the cases with a per-thread loop (``Case.trip_loop``) at trip counts
around the checkpoint slots (kernels differentiated again with ``checkpoints=1`` and
``2``, whose bisection runs out of slots beyond 2 and 4 trips, and with the default)
and around the per-thread tape sizes of ``adjoint_report()``.  Each check is
:func:`kadj.testing.check_grad_cuda` with one random direction per argument.  One line
per case:
``CASE <name> OK <checks> <seconds>`` or ``CASE <name> FAIL <what failed>``.
Fresh floating-point shared and local arrays are filled with NaN, as in
tests/cuda_gallery_sim.py.
"""
import os
import sys
import time

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402

import kadj  # noqa: E402
from kadj.testing import check_grad_cuda  # noqa: E402
from kernels.cuda import MODULES, all_cases, load  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_gallery_sim import poison_scratch_arrays  # noqa: E402

SIZES = (1, 33, 64, 150)
# (checkpoint slots, trip counts): S slots bisect exactly up to 2**S trips and replay
# longer segments beyond; the default (24) runs out only at 2**24
TRIP_PLAN = ((1, (0, 2, 3)), (2, (4, 5, 9, 17)), (None, (1, 24, 25)))
TRIP_THREADS = 33          # two blocks of 32, the second with one thread


def _rng(name, *key):
    return np.random.default_rng([sum(map(ord, name)), *key])


def _check(kernel, case, config, args, seed):
    check_grad_cuda(kernel, config, args, directions=1, rtol=case.rtol, seed=seed)


def size_checks(case):
    """(label, kernel, config, args) at every size of SIZES."""
    for n in SIZES:
        config, args = case.sized(_rng(case.name, n), n)
        yield f"n={n} {config}", case.kernel, config, args


def trip_checks(case):
    """(label, kernel, config, args) around checkpoint slots and tape sizes."""
    config, args = case.sized(_rng(case.name, 0), TRIP_THREADS)
    report = case.kernel.adjoint_report(*args)
    checkpointed = bool(report.get("loops"))
    tape = sorted(set(report.get("tape", {}).values()))
    for slots, trips in case.trip_plan or TRIP_PLAN:
        if slots is not None and not checkpointed:
            continue                       # no loop reversed from checkpoints
        kernel = case.kernel if slots is None else kadj.differentiate(
            case.kernel.dispatcher, wrt=case.kernel.wrt, checkpoints=slots)
        if slots is None and case.trip_plan is None:
            near_tape = {t + d for t in tape for d in (-1, 0, 1) if t + d >= 0}
            trips = sorted(set(trips) | near_tape)
        for t in trips:
            config, args = case.sized(_rng(case.name, t), TRIP_THREADS, trips=t)
            yield f"checkpoints={slots or 'default'} trips={t}", kernel, config, args


def run(case, checks):
    t0 = time.perf_counter()
    failures, count = [], 0
    for label, kernel, config, args in checks(case):
        count += 1
        try:
            _check(kernel, case, config, args, seed=count)
        except Exception as exc:  # reported to the parent test
            text = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            failures.append(f"{label}: {text[:600]}")
    if failures:
        print(f"CASE {case.name} FAIL {len(failures)} of {count} checks failed: "
              + " || ".join(failures), flush=True)
    else:
        print(f"CASE {case.name} OK {count} {time.perf_counter() - t0:.2f}s", flush=True)


def main(argv):
    group, wanted = argv[0], set(argv[1:])
    poison_scratch_arrays()
    import warp_sim_api             # the simulator has no warp shuffles (kernels/cuda/warps)
    warp_sim_api.install()
    if group == "trips":
        cases, checks = [c for c in all_cases() if c.trip_loop], trip_checks
    elif group in MODULES:
        cases, checks = load(group), size_checks
    else:
        raise SystemExit(f"unknown group {group!r}: one of {MODULES + ('trips',)}")
    for case in cases:
        if not wanted or case.name in wanted:
            run(case, checks)


if __name__ == "__main__":
    main(sys.argv[1:])
