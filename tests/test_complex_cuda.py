"""Complex numbers in CUDA kernels (complex64/complex128 arrays and scalars), adjoint
and tangent, with the CPU's convention: the adjoint of z = x + iy holds dL/dx + i dL/dy.

- Simulator (tests/complex_cuda_sim.py, in a subprocess with NUMBA_ENABLE_CUDASIM=1): a
  complex-coefficient wave stencil (complex128 and complex64), a split-step phase
  kernel with a real potential, a DFT per thread and a real loss of complex values
  summed with an atomic, a complex shared tile between barriers, complex coefficients
  every thread reads (block sums), a complex64 state carried through a loop: adjoints against central differences in the real and the
  imaginary direction, tangents against central differences, the dot-product test;
  ``check_grad_cuda`` on complex inputs.
- A complex thread-local array a reversed loop would save on the (real) tape is
  refused with its location (its forward mode, which needs no tape, is checked).
- PTX: numba-cuda has no complex atomic add; each complex atomic accumulation is two
  float atomics (real and imaginary part), so every adjoint and tangent compiles, with
  one float atomic instruction per atomic the source writes.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from cudatools import nvvm_available, run_sim_cases

cuda = pytest.importorskip("numba.cuda")
import complex_cuda_sim as cases  # noqa: E402

NAMES = tuple(cases.CASES) + ("rotations_local:jvp", "check_grad_cuda")
_OK, _WHY = nvvm_available()
needs_nvvm = pytest.mark.skipif(not _OK, reason=_WHY)


@pytest.fixture(scope="module")
def sim():
    return run_sim_cases("complex_cuda_sim.py", list(NAMES))


@pytest.mark.slow   # the CUDA simulator; its PTX tests run by default (-m slow runs it)
@pytest.mark.parametrize("name", NAMES)
def test_complex_kernel_in_the_simulator(sim, name):
    status, detail = sim[name]
    assert status == "OK", detail


def _atomics(ptx):
    return re.findall(r"^\s*(?:atom|red)\.\S+", ptx, re.M)


def _source_atomics(src):
    """The source's atomics: its ``cuda.atomic.add`` lines, and one per block sum of a
    real scalar (``_block_add_f64(...)``, whose one atomic is in kadj.cuda.block_sum)."""
    return [ln for ln in src.splitlines()
            if ln.strip().startswith(("cuda.atomic.add(", "_block_add_f"))]


@needs_nvvm
@pytest.mark.parametrize("name", tuple(cases.CASES))
def test_complex_adjoint_and_tangent_compile_to_ptx(name):
    k, _, args = cases.CASES[name](np.random.default_rng(0))
    compiled = k.compiled(*args)
    forms = ["scatter"] + (["gather", "zero"] if compiled.gather is not None else [])
    width = "f32" if any(np.asarray(a).dtype == np.complex64 for a in args) else "f64"
    for form in forms:
        src = compiled.source if form == "scatter" else \
            compiled.gather.sources[forms.index(form) - 1]
        ptx = k.adjoint_ptx(*args, cc=(9, 0), form=form)
        assert ".entry" in ptx
        atomics = _atomics(ptx)
        # one float atomic per atomic the source writes (the gather form's guarded
        # wrap-around atomics may be proven dead), none on 128-bit values
        if form == "scatter":
            assert len(atomics) == len(_source_atomics(src)), (atomics, src)
        else:
            assert len(atomics) <= len(_source_atomics(src)), (atomics, src)
        assert all(a.endswith(width) for a in atomics), atomics
    split = compiled.report.get("complex_atomics", {})
    real_imag = [ln for ln in _source_atomics(compiled.source) if ".real," in ln
                 or ".imag," in ln]
    assert len(real_imag) == 2 * sum(split.values())
    ptx = k.jvp_ptx(*args, cc=(9, 0))
    # forward mode adds no atomic of its own: the forward's and its tangent's only
    assert len(_atomics(ptx)) == (2 if name == "power_loss" else 0)


def test_complex_atomics_are_split_in_the_source():
    k, _, args = cases.CASES["dft_thread"](np.random.default_rng(0))
    src = k.adjoint_source(*args)
    real = re.findall(r"cuda\.atomic\.add\(adj_x\.real, (\w+), (\w+)\.real\)", src)
    imag = re.findall(r"cuda\.atomic\.add\(adj_x\.imag, (\w+), (\w+)\.imag\)", src)
    assert real and real == imag, src
    assert k.compiled(*args).report["complex_atomics"] == {"x": len(real)}


def test_complex_local_array_saved_by_a_reversed_loop_is_refused_with_location():
    """The bounded tape holds real values: a complex thread-local array a loop reversed
    from checkpoints would save is refused, located; forward mode needs no tape."""
    import kadj
    k, _, args = cases.REFUSED["rotations_local"](np.random.default_rng(0))
    with pytest.raises(kadj.DifferentiationError,
                       match=r"complex_cuda_sim\.py:\d+: the complex array\(s\) w would "
                             r"have to be saved on the tape"):
        k.adjoint_source(*args)
    assert "dot_w = cuda.local.array(3, " in k.jvp_source(*args)


@needs_nvvm
def test_complex_trig_functions_compile_to_ptx():
    """cmath's trig/hyperbolic functions, log10 and phase in a CUDA kernel: the adjoint
    and the tangent compile (device functions for cc 9.0 with no GPU: kadj.cuda.ptx_cc)."""
    import cmath

    import kadj

    @kadj.differentiate
    @cuda.jit
    def trig(z, out):
        i = cuda.grid(1)
        if i < z.shape[0]:
            w = z[i]
            out[i] = (cmath.sin(w) + cmath.cos(w) * cmath.tan(w) + cmath.sinh(w)
                      - cmath.cosh(w) * cmath.tanh(w) + cmath.log10(w) + cmath.phase(w))

    args = (np.ones(8, np.complex128), np.zeros(8, np.complex128))
    assert ".entry" in trig.adjoint_ptx(*args, cc=(9, 0))
    assert ".entry" in trig.jvp_ptx(*args, cc=(9, 0))
