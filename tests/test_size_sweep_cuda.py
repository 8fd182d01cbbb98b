"""The CUDA gallery (kernels/cuda) at many sizes, in the CUDA simulator.

tests/size_sweep_cuda_sim.py runs in subprocesses with NUMBA_ENABLE_CUDASIM=1 set
before numba is imported (this process may already have imported numba without it),
one per gallery module plus one for trip counts, in parallel:

- every case at several sizes (``Case.sized``): one element, sizes that leave the last
  block partial, an exact multiple of the block size, 2-D and 3-D grids with partial
  blocks along each axis;
- every case with a per-thread loop at trip counts around the checkpoint slots
  (``checkpoints=1`` and ``2`` as well as the default 24) and around the per-thread
  tape sizes of ``adjoint_report()``, including zero trips.

Each check is :func:`kadj.testing.check_grad_cuda` with one random direction per
argument, against float64 central differences.
"""
import fcntl
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("numba.cuda")
# about 5 minutes of the simulator on two cores: the slow run (-m slow), which CI runs
pytestmark = pytest.mark.slow

from kernels.cuda import MODULES, all_cases, load  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GROUPS = (*MODULES, "trips")
PARAMS = ([pytest.param(m, c.name, id=c.name) for m in MODULES for c in load(m)]
          + [pytest.param("trips", c.name, id=f"trips-{c.name}")
             for c in all_cases() if c.trip_loop])


def _run_group(group):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "size_sweep_cuda_sim.py"),
                           group], env=env, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, rest = line.split(" ", 3)
            out[name] = (status, rest)
    return out, proc


@pytest.fixture(scope="module")
def sweep_results(tmp_path_factory):
    """{group: ({case: (status, detail)}, CompletedProcess)}, all groups at once.  Under
    pytest-xdist the first worker to need them runs the simulator children and the
    others read its results (the workers share the parent of their temporary
    directories), rather than each worker running them again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / "size_sweep_cuda.pickle"
    with open(root / "size_sweep_cuda.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return pickle.loads(path.read_bytes())
        workers = max(1, min(len(GROUPS), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            results = dict(zip(GROUPS, pool.map(_run_group, GROUPS)))
        path.write_bytes(pickle.dumps(results))
        return results


@pytest.mark.parametrize("group,name", PARAMS)
def test_gradient_across_sizes(sweep_results, group, name):
    results, proc = sweep_results[group]
    if name not in results:
        pytest.fail(f"no result for {name}: the simulator subprocess for {group} ended "
                    f"with code {proc.returncode}\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    status, detail = results[name]
    assert status == "OK", detail


def test_every_case_has_a_size():
    missing = [c.name for c in all_cases() if c.sized is None]
    assert not missing, f"CUDA gallery cases without sized(rng, n, trips): {missing}"


@pytest.mark.parametrize("case", all_cases(), ids=[c.name for c in all_cases()])
def test_sized_launches(case):
    """sized() keeps make_args' argument kinds and dtypes, launches enough threads for
    its elements, at most 384 per launch, and refuses ``trips`` without a per-thread
    loop (no simulator needed)."""
    small = case.make_args(np.random.default_rng(0))
    for n in (1, 33, 150):
        (grid, block), args = case.sized(np.random.default_rng(n), n)
        assert len(args) == len(small), case.name
        for got, ref in zip(args, small):
            assert type(got) is type(ref), (case.name, n)
            if isinstance(ref, np.ndarray):
                assert got.dtype == ref.dtype and got.ndim == ref.ndim, (case.name, n)
        threads = int(np.prod(grid)) * int(np.prod(block))
        assert threads <= 384, (case.name, n, grid, block)
    if case.trip_loop:
        for trips in (0, 5):
            case.sized(np.random.default_rng(0), 20, trips=trips)
    else:
        with pytest.raises(ValueError, match="no per-thread loop"):
            case.sized(np.random.default_rng(0), 20, trips=3)
