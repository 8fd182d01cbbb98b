"""kadj's pytest plugin (kadj_pytest): the kadj_check and kadj_benchmark fixtures, run
in inner pytest sessions (pytester), and its registration."""
import json
import subprocess
import sys

import os
import pathlib

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[1])

pytest_plugins = ["pytester"]

# the inner sessions load the plugin by module (-p), whether or not it is installed
PLUGIN = ("-p", "no:kadj", "-p", "kadj_pytest", "-p", "no:cacheprovider")

INNER = '''
import numpy as np
from numba import njit

import kadj
from kadj.plan import AdjointPlan


@kadj.differentiate
@njit
def recurrence(y, x, a):
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] * y[i] + x[i]
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] * y[i] + x[i]


class WrongScale:
    """y = a * sin(x) with a hand-written adjoint that forgets the factor a."""
    __name__ = "wrong_scale"

    def adjoint_plan(self, *args):
        return AdjointPlan("wrong_scale", ("x", "y", "a"), (0, 1, 2), frozenset({1}),
                           frozenset({0}), False)

    def forward(self, x, y, a):
        y[:] = a * np.sin(x)

    def adjoint(self, x, y, a, adj_x, adj_y, adj_a):
        adj_x += np.cos(x) * adj_y
        adj_a[0] += np.sum(np.sin(x) * adj_y)
        adj_y[:] = 0.0


def args(n=50):
    rng = np.random.default_rng(0)
    return rng.random(n), rng.random(n), 0.5


def test_right(kadj_check):
    result = kadj_check(recurrence, args(8))
    assert result.kernel_name == "recurrence" and result.jacobian_checked


def test_wrong(kadj_check):
    kadj_check(WrongScale(), (np.linspace(0.1, 0.8, 6), np.zeros(6), 3.0))


def test_cuda_without_launch(kadj_check):
    class Fake:
        target_name = "cuda"
        __name__ = "fake_cuda"
    kadj_check(Fake(), ())


def test_bench(kadj_benchmark):
    card = kadj_benchmark(recurrence, args(), repeat=3)
    assert card["kernel"] == "recurrence"
'''


@pytest.fixture
def inner(pytester, monkeypatch):
    """A directory with the inner tests; sessions run in a child process (numba
    registers its implementations once per process, which an in-process session that
    forgets the modules it imported would repeat) that imports this checkout's kadj."""
    pytester.makepyfile(test_inner=INNER)
    _child_imports_this_checkout(monkeypatch)
    return pytester


def _child_imports_this_checkout(monkeypatch):
    # the child is a session of its own, not a pytest-xdist worker (pytest-benchmark
    # leaves the JSON to the controller when it believes it runs in a worker)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                 "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def test_checks_pass_fail_readably_and_benchmark_records_the_cost_card(inner, tmp_path):
    pytest.importorskip("pytest_benchmark")
    saved = tmp_path / "bench.json"
    result = inner.runpytest_subprocess(*PLUGIN, f"--benchmark-json={saved}",
                                        "--benchmark-max-time=0.05")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    # the failure names the kernel, the argument and the elements with both values
    assert "kadj gradient check failed for kernel 'wrong_scale'" in out
    assert "argument 'x'" in out
    assert "x[0]: adjoint" in out and "finite differences" in out
    # ... one element per line, and no traceback into kadj's checker
    assert sum(1 for ln in out.splitlines() if ln.strip().startswith("x[")) >= 5
    assert "kadj/testing" not in out and "During handling" not in out
    assert "'fake_cuda' is a CUDA kernel: give its launch" in out

    (bench,) = json.loads(saved.read_text())["benchmarks"]
    info = bench["extra_info"]
    # 96 float64 values recorded: each loop's 49 iterations define afresh a value a
    # later store overwrites (the first loop's y[i - 1], which the second loop rewrites;
    # the second loop's y[i]), saved from the second iteration on
    assert info["kadj_recorded_values"] == 96 and info["kadj_tape_bytes"] == 96 * 8
    assert info["kadj_tape_per"] == "call"
    assert info["kadj_accumulation"] == {"y": "plain", "x": "plain", "a": "plain"}
    assert info["kadj_forward_s"] > 0 and info["kadj_adjoint_s"] > 0
    assert info["kadj_adjoint_over_forward"] == pytest.approx(
        info["kadj_adjoint_s"] / info["kadj_forward_s"])
    assert bench["stats"]["rounds"] >= 1      # the adjoint itself was benchmarked


def test_benchmark_skips_without_pytest_benchmark(pytester, monkeypatch):
    _child_imports_this_checkout(monkeypatch)
    pytester.makepyfile(test_skip="def test_bench(kadj_benchmark):\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:benchmark", "-rs")
    result.assert_outcomes(skipped=1)
    assert "kadj_benchmark needs pytest-benchmark" in result.stdout.str()


def test_plugin_imports_neither_kadj_nor_numba():
    code = ("import sys, kadj_pytest; "
            "print(sorted(m for m in ('kadj', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_registered_as_a_pytest11_entry_point():
    from importlib.metadata import entry_points
    found = [ep for ep in entry_points(group="pytest11") if ep.name == "kadj"]
    if not found:
        pytest.fail("kadj is not registered as a pytest11 entry point: reinstall it "
                    "(pip install -e .) after pyproject.toml changed")
    assert found[0].value == "kadj_pytest"
