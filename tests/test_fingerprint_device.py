"""Fingerprints of device arrays are computed on the device (a hash kernel): equal for
equal contents, different after any single-element change or a swap, through strides
and misaligned starts; a tape of CUDA launches checks for unrecorded changes on the
device without copying to the host or waiting, fills the gradients with NaN when an
array was changed, and raises the named error from tape.check(), from tape.grad()
once the device is done, and from the calls that return host results.  Run in the
CUDA simulator (a subprocess with NUMBA_ENABLE_CUDASIM=1,
tests/fingerprint_device_sim.py)."""
import pytest

from cudatools import run_sim_cases

CASES = ["equal_contents", "single_changes", "permutations", "strided_and_misaligned",
         "interface_objects", "tape_device_checks", "tape_device_pending",
         "tape_host_fingerprints"]


@pytest.fixture(scope="module")
def results():
    return run_sim_cases("fingerprint_device_sim.py", CASES)


@pytest.mark.slow   # the CUDA simulator (-m slow runs it, as CI does)
@pytest.mark.parametrize("name", CASES)
def test_device_fingerprint_in_simulator(results, name):
    status, detail = results[name]
    assert status == "OK", detail


def test_hash_kernel_compiles_for_a_gpu():
    """The hash kernel compiles to PTX in uint64 arithmetic (no float64 promotion) with
    one global atomic per lane, and the gather kernels compile for strided arrays."""
    from numba import cuda, types

    from kadj import device_ops
    ptx, _ = cuda.compile_ptx(device_ops._hash.py_func,
                              (types.uint64[::1], types.uint8[::1], types.uint64[::1]),
                              cc=(9, 0))
    assert "f64" not in ptx
    assert ptx.count("atom.global.add.u64") == 2, ptx.count("atom")
    for ndim, kernel in device_ops._GATHER.items():
        cuda.compile_ptx(kernel.py_func, (types.Array(types.float32, ndim, "A"),
                                          types.float32[::1]), cc=(9, 0))


def test_check_kernels_compile_for_a_gpu():
    """The compare, poison and publish kernels of a tape's change flag compile to PTX:
    one 64-bit atomic max in the compare, no atomics elsewhere."""
    from numba import cuda, types

    from kadj import device_ops
    ptx, _ = cuda.compile_ptx(device_ops._compare.py_func,
                              (types.uint64[::1], types.uint64[::1], types.int64[::1],
                               types.int64), cc=(9, 0))
    assert ptx.count("atom.global.max.s64") == 1, ptx
    for dtype in (types.float64, types.float32):
        ptx, _ = cuda.compile_ptx(device_ops._poison.py_func,
                                  (dtype[::1], types.int64[::1]), cc=(9, 0))
        assert "atom" not in ptx and "st.global" in ptx
    ptx, _ = cuda.compile_ptx(device_ops._publish.py_func,
                              (types.int64[::1], types.int64[::1]), cc=(9, 0))
    assert "st.global.u64" in ptx or "st.global.b64" in ptx, ptx
