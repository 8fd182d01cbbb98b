"""Device-resident backward: in the CUDA simulator (a subprocess with
NUMBA_ENABLE_CUDASIM=1, tests/tape_sim_cases.py), a tape of launches on device arrays
runs its backward with no device-to-host copy and no synchronisation, tape.grad returns
device arrays, and the gradients equal the host tape's and finite differences."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["device_resident_one_stream", "device_resident_two_streams",
         "add_into_on_device"]


def run_cases(cases):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "tape_sim_cases.py"),
                           *cases], env=env, capture_output=True, text=True, timeout=600)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = line.split(" ", 3)
            out[name] = (status, rest)
    if set(out) != set(cases):
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out


@pytest.fixture(scope="module")
def results():
    return run_cases(CASES)


@pytest.mark.parametrize("name", CASES)
def test_device_backward_in_simulator(results, name):
    status, detail = results[name]
    assert status == "OK", detail
