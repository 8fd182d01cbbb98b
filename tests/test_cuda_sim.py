"""CUDA gradients in the simulator: tests/cuda_sim_cases.py runs in a subprocess with
NUMBA_ENABLE_CUDASIM=1 set before numba is imported (this process may already have
imported numba without it)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["heat_step", "laplace2d", "scaled_sin", "pointwise", "with_device_helper",
         "checkpointed_loop", "checkpointed_loop_2_slots",
         "newton_while", "gridstride_time_loop", "nested_carried_loops",
         "in_place_update", "local_array_state", "tape_numpy", "tape_device_arrays",
         "stream_device_arrays_errors", "scatter_form", "grid_not_covering_uses_scatter",
         "gather_2d_blocks", "gather_wrapped_index", "gather_refused_thread_ids",
         "uniform_elements_block_reduced", "gather_with_recorded_branch",
         "ptx_under_simulator", "shared_tile_read_after_loop", "hostile_names"]


@pytest.fixture(scope="module")
def sim_results():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cuda_sim_cases.py"),
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
def test_gradient_matches_finite_differences(sim_results, name):
    status, detail = sim_results[name]
    assert status == "OK", detail
