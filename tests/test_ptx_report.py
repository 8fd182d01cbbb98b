"""scripts/ptx_report.py on the CUDA benchmark cases (PTX from NVVM, no GPU needed), and
the hand-written CUDA adjoints of perf/cases_cuda.py checked against finite differences
in the simulator, so that the benchmark's baseline is a correct adjoint."""
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba.cuda")

ROOT = Path(__file__).resolve().parents[1]
HAND_CASES = ["heat2d", "heat1d", "lap3d", "spmv", "deposit"]


def _probe():
    from cudatools import nvvm_available
    return nvvm_available()


_PTX_OK, _PTX_WHY = _probe()
needs_ptx = pytest.mark.skipif(not _PTX_OK, reason=_PTX_WHY)


def _load_script():
    spec = importlib.util.spec_from_file_location("ptx_report",
                                                  ROOT / "scripts" / "ptx_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One in-process run of the script's main() on the perf cases: (exit status,
    printed table, JSON records)."""
    mod = _load_script()
    out = tmp_path_factory.mktemp("ptx") / "report.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = mod.main(["--no-gallery", "--json", str(out)])
    return status, buf.getvalue(), json.loads(out.read_text())


@needs_ptx
def test_report_covers_every_case(report):
    from perf.cases_cuda import CASES

    status, text, data = report
    assert status == 0, text
    assert data["cc"] == [9, 0]
    names = [r["name"] for r in data["records"]]
    assert sorted(names) == sorted(c.name for c in CASES)
    for name in names:
        assert name in text


@needs_ptx
@pytest.mark.parametrize("name", HAND_CASES)
def test_case_ptx_counts(report, name):
    _, _, data = report
    (rec,) = [r for r in data["records"] if r["name"] == name]
    assert not rec.get("failed"), rec
    assert "hand" in rec, rec                    # the hand-written adjoint always compiles
    assert "kadj" in rec or "kadj_refused" in rec, rec
    for who in ("kadj", "hand"):
        if who not in rec:
            continue
        r = rec[who]
        assert r["entries"] == r["kernels"] >= 1   # every PTX has its .entry
        for key in ("atomics", "atomics_global", "atomics_shared", "instructions"):
            assert isinstance(r[key], int) and r[key] >= 0, (key, r)
        assert r["instructions"] > 0
        assert r["atomics"] == sum(r["atomic_classes"].values())
        assert r["atomics_global"] + r["atomics_shared"] <= r["atomics"]
    if "kadj" in rec:
        assert isinstance(rec["kadj_report"], dict)
        assert "atomics" in rec["kadj_report"]
        # the hand-written adjoint takes kadj's argument layout
        import numpy as np

        from perf.cases_cuda import CASES_BY_NAME
        case = CASES_BY_NAME[name]
        args = case.make_args(case.size("check"), np.random.default_rng(0))
        assert case.kernel.adjoint_plan(*args).adjoint_names() == case.adjoint_names()


def test_ptx_parsing():
    mod = _load_script()
    ptx = "\n".join([
        ".visible .entry k(",
        "{",
        "\tld.global.f64 \t%fd1, [%rd1];",
        "\tatom.global.add.f64 \t%fd2, [%rd2], %fd1;",
        "\t@%p1 red.global.add.f32 \t[%rd3], %f1;",
        "\tatom.shared.add.f64 \t%fd3, [%rd4], %fd1;",
        "\tatom.relaxed.gpu.global.cas.b32 \t%r1, [%rd5], %r2, %r3;",
        "$L__BB0_2:",
        "\tret;",
        "}",
    ])
    r = mod.analyze_ptx([ptx])
    assert r["entries"] == 1
    assert r["atomics"] == 4
    assert r["atomics_global"] == 3 and r["atomics_shared"] == 1
    assert r["atomic_classes"] == {"global add.f32": 1, "global add.f64": 1,
                                   "global cas.b32": 1, "shared add.f64": 1}
    assert r["instructions"] == 6


def _simulator_checks(which, cases=()):
    """``python -m perf.cases_cuda WHICH [case ...]`` with NUMBA_ENABLE_CUDASIM=1 (set
    before numba is imported, hence the subprocess): {case: (status, detail)}."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "perf.cases_cuda", which, *cases],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, status, *rest = line.split(" ", 3)
            out[name] = (status, rest[0] if rest else "")
    if not out:
        pytest.fail(f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}")
    return out


@pytest.fixture(scope="module")
def hand_checks():
    """Dot-product tests of every hand-written adjoint against central differences of
    its forward, at the cases' check sizes, in the simulator."""
    return _simulator_checks("hand", HAND_CASES)


@pytest.mark.slow   # the CUDA simulator (-m slow runs it, as CI does)
@pytest.mark.parametrize("name", HAND_CASES)
def test_hand_adjoint_matches_finite_differences(hand_checks, name):
    status, detail = hand_checks[name]
    assert status == "OK", detail


@pytest.fixture(scope="module")
def naive_checks():
    """The same for the hand-written adjoints that add the scalar's adjoint with one
    atomic per thread (``case.naive``, the baseline of the block sums in
    ``scripts/bench_cuda.py``)."""
    return _simulator_checks("naive")


@pytest.mark.slow   # the CUDA simulator
@pytest.mark.parametrize("name", ["heat1d", "heat2d"])
def test_naive_atomics_adjoint_matches_finite_differences(naive_checks, name):
    status, detail = naive_checks[name]
    assert status == "OK", detail


@needs_ptx
def test_sass_statistics_of_the_gather_kernels():
    """``--sass``: ptxas's registers and SASS instruction counts per kernel (no GPU
    needed).  The gather form's guards are evaluated once per pass and its block sums
    finish with a device function: the 3-D gather kernel stays well under twice the
    hand-written one's instructions and within its registers."""
    mod = _load_script()
    ptxas = mod.find_ptxas()
    if ptxas is None:
        pytest.skip("no ptxas here (nvidia-cuda-nvcc-cu12 not installed)")
    records, _ = mod.build_report((9, 0), ["heat2d", "lap3d"], gallery=False, sass=ptxas)
    for r in records:
        hand = r["hand"]["sass"]
        gather, zero = r["kadj_gather"]["sass"]
        fwd = r["forward"]["sass"][0]
        for st in (fwd, gather, zero, *hand):
            assert st["registers"] and st["sass_instructions"] > 0, st
            assert st["spill_bytes"] == 0, (r["name"], st)
        assert gather["registers"] <= max(hand[0]["registers"], 32), (r["name"], gather)
        assert gather["sass_instructions"] < 2 * hand[0]["sass_instructions"], \
            (r["name"], gather, hand[0])
