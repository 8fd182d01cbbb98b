"""CUDA gradients in the simulator: tests/cuda_sim_cases.py runs in a subprocess with
NUMBA_ENABLE_CUDASIM=1 set before numba is imported (this process may already have
imported numba without it)."""

import pytest

from cudatools import run_sim_cases

# Run by default: one case per kind of CUDA kernel (stencils, helpers, checkpointed and
# while loops, in-place state, the tape with host and device arrays, the scatter,
# gather and block-reduced forms).  The variants run with -m slow (as CI does).
CASES = ["heat_step", "laplace2d", "with_device_helper", "checkpointed_loop",
         "newton_while", "gridstride_time_loop", "in_place_update",
         "own_element_read_twice", "rebound_scalar", "strided_elements",
         "shared_reduction_in_helper", "tile_in_each_arm",
         "gather_store_overwritten", "gather_dead_neighbour_read",
         "own_rows_in_each_branch", "helper_after_nested_return",
         "two_loops_with_returns", "tape_numpy",
         "tape_device_arrays", "scatter_form", "gather_2d_blocks",
         "uniform_elements_block_reduced", "hostile_names", "row_private",
         "row_and_next_row"]
SLOW_CASES = ["scaled_sin", "pointwise", "checkpointed_loop_2_slots",
              "while_break_on_running_value", "nested_carried_loops",
              "inner_loop_reads_overwritten_state", "local_array_state",
              "stream_device_arrays_errors", "grid_not_covering_uses_scatter",
              "gather_wrapped_index", "gather_refused_thread_ids",
              "gather_with_recorded_branch", "ptx_under_simulator",
              "shared_tile_read_after_loop"]


@pytest.fixture(scope="module")
def sim_results():
    return run_sim_cases("cuda_sim_cases.py", CASES)


@pytest.mark.parametrize("name", CASES)
def test_gradient_matches_finite_differences(sim_results, name):
    status, detail = sim_results[name]
    assert status == "OK", detail


@pytest.fixture(scope="module")
def slow_sim_results():
    return run_sim_cases("cuda_sim_cases.py", SLOW_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_CASES)
def test_gradient_matches_finite_differences_variants(slow_sim_results, name):
    status, detail = slow_sim_results[name]
    assert status == "OK", detail
