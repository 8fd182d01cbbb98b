"""kadj.checkpointed_loop with CUDA kernels and device arrays, in the simulator:
tests/checkpointed_cuda_sim.py runs in a subprocess with NUMBA_ENABLE_CUDASIM=1 set
before numba is imported (this process may already have imported numba without it).

Each case compares the checkpointed loop's gradients with those of the same launches on
a store-everything tape, checks the binomial schedule's step executions and peak
snapshots (at most ``snapshots``, from ``tape.memory_report()``), and, for device
arrays, that the gradients stay on the device, the loop's snapshots are device copies and
the loop copies nothing to the host."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["heat_device_1_1", "heat_device_2_1", "heat_device_5_2", "heat_device_12_3",
         "heat_numpy_2_1", "heat_numpy_12_3", "rotation_device_7_2",
         "non_contiguous_state"]


@pytest.fixture(scope="module")
def sim_results():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "checkpointed_cuda_sim.py"),
                           *CASES], env=env, capture_output=True, text=True, timeout=600)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = line.split(" ", 3)
            out[name] = (status, rest)
    if not out:
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out


@pytest.mark.parametrize("name", CASES)
def test_checkpointed_cuda_matches_store_everything(sim_results, name):
    assert name in sim_results, f"case {name} did not report"
    status, detail = sim_results[name]
    assert status == "OK", detail
