"""kadj.checkpointed_loop with CUDA kernels and device arrays, in the simulator:
tests/checkpointed_cuda_sim.py runs in a subprocess with NUMBA_ENABLE_CUDASIM=1 set
before numba is imported (this process may already have imported numba without it).

Each case compares the checkpointed loop's gradients with those of the same launches on
a store-everything tape, checks the binomial schedule's step executions and peak
snapshots (at most ``snapshots``, from ``tape.memory_report()``), and, for device
arrays, that the gradients stay on the device, the loop's snapshots are device copies and
the loop copies nothing to the host."""

import pytest

from cudatools import run_sim_cases

CASES = ["heat_device_1_1", "heat_device_2_1", "heat_device_5_2", "heat_device_12_3",
         "heat_numpy_2_1", "heat_numpy_12_3", "rotation_device_7_2",
         "non_contiguous_state"]


@pytest.fixture(scope="module")
def sim_results():
    return run_sim_cases("checkpointed_cuda_sim.py", CASES)


@pytest.mark.parametrize("name", CASES)
def test_checkpointed_cuda_matches_store_everything(sim_results, name):
    assert name in sim_results, f"case {name} did not report"
    status, detail = sim_results[name]
    assert status == "OK", detail
