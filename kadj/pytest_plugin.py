"""What kadj's pytest plugin's fixtures do: gradient checks and gradient benchmarks.

The plugin itself is :mod:`kadj_pytest`, registered through the ``pytest11`` entry point
(active wherever kadj is installed; ``-p no:kadj`` turns it off).  It defines the two
fixtures below and imports this module (hence numba) only when a test uses one, so that
pytest starts as fast as without it and numba is imported after the suite's conftest.

``kadj_check(kernel, args, launch=None, **options)``
    Checks the kernel's gradient against finite differences
    (:func:`kadj.testing.check_grad`; a CUDA kernel with :func:`check_grad_cuda`,
    launched as ``kernel[launch]``) and returns the :class:`GradCheckResult`.  A wrong
    gradient fails the test with the check's explanation (the argument, the elements
    that differ, the adjoint's values against finite differences), without a
    traceback into kadj.

``kadj_benchmark(kernel, args, launch=None, repeat=5)``
    Times the kernel's adjoint with pytest-benchmark's ``benchmark`` fixture and the
    forward beside it, and records the cost card (:mod:`kadj.cost_card`) in
    ``benchmark.extra_info``: ``kadj_forward_s``, ``kadj_adjoint_s``,
    ``kadj_adjoint_over_forward``, ``kadj_tape_bytes``, ``kadj_recorded_values``,
    ``kadj_accumulation``, ``kadj_atomics`` (and the rest of the card), so that the
    saved JSON history shows gradient regressions beside forward ones.  Skips, saying
    why, without pytest-benchmark or, for a CUDA kernel, without a GPU.
"""
from __future__ import annotations

import re

import pytest

# where a listed element (x[3]: ..., d(y[1] after)/d(x[2] before): ...) begins
_ITEM = re.compile(r"(?<=[:;]) (?=(?:[A-Za-z_]\w*\[|d\())")


def _is_cuda(kernel):
    if getattr(kernel, "target_name", None) == "cuda":
        return True
    return "cuda" in type(kernel).__module__


def _readable(name, launch, message):
    """The failure text: a heading, then the check's message with one listed element
    per line."""
    where = f" launched as [{', '.join(map(str, launch))}]" if launch is not None else ""
    body = _ITEM.sub("\n    ", str(message))
    return f"kadj gradient check failed for kernel '{name}'{where}:\n  {body}"


def make_check():
    """The ``kadj_check`` fixture's function."""
    def check(kernel, args, launch=None, **options):
        from kadj.testing import check_grad, check_grad_cuda

        name = getattr(kernel, "__name__", repr(kernel))
        cuda = _is_cuda(kernel)
        if cuda and launch is None:
            pytest.fail(f"kadj_check: '{name}' is a CUDA kernel: give its launch, "
                        "kadj_check(kernel, args, launch=(blocks, threads))",
                        pytrace=False)
        try:
            if cuda:
                return check_grad_cuda(kernel, launch, args, **options)
            return check_grad(kernel, args, **options)
        except AssertionError as exc:
            failure = _readable(name, launch if cuda else None, exc)
        pytest.fail(failure, pytrace=False)     # outside the handler: no chained trace
    return check


def make_benchmark(request):
    """The ``kadj_benchmark`` fixture's function (skips without pytest-benchmark)."""
    try:
        benchmark = request.getfixturevalue("benchmark")
    except pytest.FixtureLookupError:
        pytest.skip("kadj_benchmark needs pytest-benchmark (pip install "
                    "pytest-benchmark), which is not installed")

    def run(kernel, args, launch=None, repeat=5):
        import kadj
        from kadj import cost_card

        if not hasattr(kernel, "adjoint_source"):
            kernel = kadj.differentiate(kernel)
        args = tuple(kernel.complete_args(tuple(args)))
        cuda = _is_cuda(kernel)
        if cuda and not cost_card.gpu_present():
            pytest.skip(f"kadj_benchmark: '{kernel.__name__}' is a CUDA kernel and "
                        "there is no GPU to time it on")
        if cuda and launch is None:
            pytest.fail(f"kadj_benchmark: '{kernel.__name__}' is a CUDA kernel: give "
                        "its launch, kadj_benchmark(kernel, args, launch=(blocks, "
                        "threads))", pytrace=False)
        card = cost_card.build(kernel, args, launch, repeat)
        benchmark.extra_info.update({f"kadj_{k}": v for k, v in card.items()})
        benchmark(_adjoint_call(kernel, args, launch))
        return card
    return run


def _adjoint_call(kernel, args, launch):
    """A function that runs the adjoint once on fixed buffers (an adjoint only adds
    into its input adjoints, so repeated calls cost the same)."""
    from kadj.tape_measure import adjoint_buffers

    bufs = adjoint_buffers(kernel.adjoint_plan(*args), args)
    if launch is None:
        return lambda: kernel.adjoint(*args, *bufs)
    from kadj.cuda.cost import adjoint_launcher
    return adjoint_launcher(kernel, args, bufs, launch)
