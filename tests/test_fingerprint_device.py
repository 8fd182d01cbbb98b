"""Fingerprints of device arrays are computed on the device (a hash kernel): equal for
equal contents, different after any single-element change or a swap, through strides
and misaligned starts; a tape of CUDA launches detects an unrecorded change between
launches.  Run in the CUDA simulator (a subprocess with NUMBA_ENABLE_CUDASIM=1,
tests/fingerprint_device_sim.py)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["equal_contents", "single_changes", "permutations", "strided_and_misaligned",
         "interface_objects", "tape_device_fingerprints", "tape_host_fingerprints"]


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE),
                                         env.get("PYTHONPATH", "")])
    script = os.path.join(HERE, "fingerprint_device_sim.py")
    proc = subprocess.run([sys.executable, script, *CASES], env=env,
                          capture_output=True, text=True, timeout=600)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = line.split(" ", 3)
            out[name] = (status, rest)
    if set(out) != set(CASES):
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out


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
