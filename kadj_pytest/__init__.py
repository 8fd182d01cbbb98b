"""kadj's pytest plugin (the ``pytest11`` entry point ``kadj``): two fixtures.

``kadj_check(kernel, args, launch=None, **options)``
    Checks a kernel's gradient against finite differences
    (:func:`kadj.testing.check_grad`, or :func:`kadj.testing.check_grad_cuda` for a CUDA
    kernel launched as ``kernel[launch]``); a wrong gradient fails the test naming the
    argument and the elements that differ (adjoint vs finite differences).

``kadj_benchmark(kernel, args, launch=None, repeat=5)``
    Benchmarks the kernel's adjoint with pytest-benchmark and records its cost card
    (adjoint/forward time, tape bytes, accumulation per argument, atomics) in
    ``benchmark.extra_info``; skips without pytest-benchmark, or for a CUDA kernel
    without a GPU.

Nothing else: no hooks, and no import of kadj or numba until a test uses a fixture
(:mod:`kadj.pytest_plugin` does the work).
"""
import pytest


@pytest.fixture
def kadj_check():
    """``kadj_check(kernel, args, launch=None, **options)``: check a kernel's gradient
    against finite differences; returns the :class:`kadj.testing.GradCheckResult`."""
    from kadj.pytest_plugin import make_check
    return make_check()


@pytest.fixture
def kadj_benchmark(request):
    """``kadj_benchmark(kernel, args, launch=None, repeat=5)``: benchmark a kernel's
    adjoint and record its cost card in ``benchmark.extra_info``; returns the card."""
    from kadj.pytest_plugin import make_benchmark
    return make_benchmark(request)
