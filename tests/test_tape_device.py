"""Device-resident backward: in the CUDA simulator (a subprocess with
NUMBA_ENABLE_CUDASIM=1, tests/tape_sim_cases.py), a tape of launches on device arrays
runs its backward with no device-to-host copy and no synchronisation -- with the check
for unrecorded changes on (the device path: fingerprints compared on the device) and
off -- tape.grad returns device arrays, and the gradients equal the host tape's and
finite differences."""
import pytest

from cudatools import run_sim_cases

CASES = ["device_resident_one_stream", "device_resident_two_streams",
         "device_resident_checked", "add_into_on_device"]


def run_cases(cases):
    """Run cases of tests/tape_sim_cases.py in the simulator (tests/test_tape_streams.py
    runs its own through this too)."""
    return run_sim_cases("tape_sim_cases.py", cases)


@pytest.fixture(scope="module")
def results():
    return run_cases(CASES)


@pytest.mark.parametrize("name", CASES)
def test_device_backward_in_simulator(results, name):
    status, detail = results[name]
    assert status == "OK", detail
