"""Forward mode of CUDA kernels: ``k.jvp[blocks, threads](*args, *tangents)``,
``k.jvp_source``, ``k.jvp_ptx``.

- Simulator (tests/jvp_cuda_sim.py, in a subprocess with NUMBA_ENABLE_CUDASIM=1): for
  CUDA gallery kernels, the tangents match float64 central differences of forward
  launches, the launch changes the forward arguments as a forward launch does, and the
  dot-product test ``<J v, w> == <v, J^T w>`` holds against ``.adjoint``.  A
  representative set runs by default (1-D and 2-D stencils, a shared-memory tile and a
  tiled matmul with barriers, a block reduction and a dot product with atomics in the
  forward, per-thread ODE loops with a local array, float32, device helpers, early
  return, atomic.sub); the rest of the gallery is marked slow.  The launch's own rules
  (configuration, keyword tangents, buffers refused) run there too.
- PTX: every gallery kernel's tangent compiles with ``numba.cuda.compile_ptx`` (no GPU);
  a kernel without atomics in its forward has none in its tangent.
- The printed tangent kernel runs as printed (executed alone, it defines the kernel
  that compiles to PTX); barriers and shared arrays mirror the forward's.
- An atomic forward mode cannot differentiate (``cuda.atomic.max``) is refused with
  its location.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import kadj
from kadj import jvp_call
from cudatools import nvvm_available, run_sim_cases
from kernels.cuda import all_cases, by_name

cuda = pytest.importorskip("numba.cuda")

DEFAULT = ("heat1d_guarded", "heat2d_step", "smooth_tiled", "tiled_matmul",
           "block_sum_squares", "dot_atomic", "logistic_euler", "rk4_local_stages",
           "heat1d_periodic_f32", "gelu_nested_helpers", "leaky_relu_early_return",
           "atomic_sub_squares", "launch_rules")
GALLERY = tuple(c.name for c in all_cases())
SLOW = tuple(n for n in GALLERY if n not in DEFAULT)

_OK, _WHY = nvvm_available()
needs_nvvm = pytest.mark.skipif(not _OK, reason=_WHY)


@pytest.fixture(scope="module")
def sim_default():
    return run_sim_cases("jvp_cuda_sim.py", list(DEFAULT))


@pytest.mark.parametrize("name", DEFAULT)
def test_jvp_in_the_simulator(sim_default, name):
    status, detail = sim_default[name]
    assert status == "OK", detail


@pytest.mark.slow
def test_jvp_in_the_simulator_whole_gallery():
    results = run_sim_cases("jvp_cuda_sim.py", list(SLOW))
    failed = {n: d for n, (s, d) in results.items() if s != "OK"}
    assert not failed, failed


def _args(name):
    return by_name(name).make_args(np.random.default_rng(0))


def _atomics(ptx):
    return [ln for ln in ptx.splitlines() if re.search(r"\b(atom|red)\.global\.", ln)]


@needs_nvvm
@pytest.mark.parametrize("name", [  # every other kernel by default, the rest: -m slow
    n if i % 2 == 0 else pytest.param(n, marks=pytest.mark.slow)
    for i, n in enumerate(GALLERY)])
def test_tangent_compiles_to_ptx(name):
    case = by_name(name)
    ptx = case.kernel.jvp_ptx(*_args(name), cc=(9, 0))
    assert ".entry" in ptx
    # forward mode adds no atomic of its own: atomics only where the forward has some
    if "atomic" not in inspect.getsource(case.kernel.py_func):
        assert not _atomics(ptx), "\n".join(_atomics(ptx))
    else:
        assert _atomics(ptx)


def test_tangent_mirrors_barriers_and_shared_arrays():
    k, args = by_name("block_sum_squares").kernel, _args("block_sum_squares")
    src = k.jvp_source(*args)
    fwd = inspect.getsource(k.py_func)
    assert src.count("cuda.syncthreads()") == fwd.count("cuda.syncthreads()") == 2
    assert re.search(r"^    sm = cuda\.shared\.array\(16, (\w+)\)\n    dot_sm = "
                     r"cuda\.shared\.array\(16, \1\)$", src, re.M), src
    # the forward's atomic and its tangent, nothing else atomic
    calls = re.findall(r"^ +(cuda\.atomic\.add\(\w+), 0, \w+\)$", src, re.M)
    assert sorted(calls) == ["cuda.atomic.add(dot_out", "cuda.atomic.add(out"], src
    assert "np.zeros" not in src and "_tape" not in src
    # a local array's tangent is a local array
    src = by_name("rk4_local_stages").kernel.jvp_source(*_args("rk4_local_stages"))
    assert re.search(r"dot_k = cuda\.local\.array\(4, \w+\)", src), src


@needs_nvvm
@pytest.mark.parametrize("name", ["smooth_tiled", "gelu_nested_helpers"])
def test_printed_tangent_runs_as_printed(name):
    """The printed source, executed alone in an empty namespace, defines the tangent
    kernel, and that compiles (the helper of gelu_nested_helpers is inlined)."""
    k, args = by_name(name).kernel, _args(name)
    src = k.jvp_source(*args)
    assert src.startswith("from numba import ") or src.startswith("import ")
    ns = {}
    exec(compile(src, f"<{name}_jvp>", "exec"), ns)
    fn = ns[f"{name}_jvp"]
    full = k.complete_args(args)
    sig = jvp_call.compiled(k, full).signature(k._arg_types(full))
    ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
    assert ".entry" in ptx


def _max_kernel():
    @cuda.jit
    def running_max(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            cuda.atomic.max(out, 0, x[i])
    return running_max


def test_atomic_max_is_refused_with_its_line():
    k = kadj.differentiate(_max_kernel())
    x, out = np.arange(8.0), np.zeros(1)
    with pytest.raises(kadj.DifferentiationError) as info:
        k.jvp_source(x, out)
    msg = str(info.value)
    line = inspect.getsourcelines(_max_kernel)[1] + 5
    assert "cuda.atomic.max" in msg and "'running_max'" in msg, msg
    assert f"test_jvp_cuda.py:{line}" in msg, msg


def test_launch_syntax():
    k = by_name("heat1d_guarded").kernel
    args = _args("heat1d_guarded")
    with pytest.raises(TypeError, match=r"heat1d_guarded\.jvp is a CUDA kernel: launch "
                                        r"it as heat1d_guarded\.jvp\[blocks, threads\]"):
        k.jvp(*args, np.zeros(13), np.zeros(13), np.zeros(1))
    with pytest.raises(ValueError, match=r"heat1d_guarded\.jvp\[0, 8\]: grid dimension x"):
        k.jvp[0, 8]


def test_a_target_without_a_tangent_writer_is_refused():
    import dataclasses
    from kadj import tangent, targets
    other = dataclasses.replace(targets.get("cuda"), name="other", title="Other",
                                write_tangent=None, compile_tangent=None)
    with pytest.raises(kadj.DifferentiationError,
                       match="forward mode \\(jvp\\) is not available for Other kernels"):
        tangent.check_target(other, "k")
    tangent.check_target(targets.get("cuda"), "k")
    tangent.check_target(targets.get("cpu"), "k")
