"""CUDA gradients in the simulator: tests/cuda_sim_cases.py runs in a subprocess with
NUMBA_ENABLE_CUDASIM=1 set before numba is imported (this process may already have
imported numba without it)."""

import pytest

from cudatools import run_sim_cases

CASES = ["heat_step", "laplace2d", "scaled_sin", "pointwise", "with_device_helper",
         "checkpointed_loop", "checkpointed_loop_2_slots",
         "newton_while", "while_break_on_running_value", "gridstride_time_loop", "nested_carried_loops",
         "inner_loop_reads_overwritten_state",
         "in_place_update", "local_array_state", "tape_numpy", "tape_device_arrays",
         "stream_device_arrays_errors", "scatter_form", "grid_not_covering_uses_scatter",
         "gather_2d_blocks", "gather_wrapped_index", "gather_refused_thread_ids",
         "uniform_elements_block_reduced", "gather_with_recorded_branch",
         "ptx_under_simulator", "shared_tile_read_after_loop", "hostile_names"]


@pytest.fixture(scope="module")
def sim_results():
    return run_sim_cases("cuda_sim_cases.py", CASES)


@pytest.mark.parametrize("name", CASES)
def test_gradient_matches_finite_differences(sim_results, name):
    status, detail = sim_results[name]
    assert status == "OK", detail
