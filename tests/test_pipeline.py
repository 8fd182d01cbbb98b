"""The pipeline's stages (kadj/pipeline.py): one stage list for every target, each
stage's output available and printable (``python -m kadj show --stage``).

The assertions are on the stages' outputs themselves (the region tree, the plan, the
prepared tree and its policy, the facts, the sources), for a CPU and a CUDA kernel.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda, njit, types

import kadj
from kadj import ir, pipeline, targets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@njit
def heat(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def total(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


def _cuda_kernels():
    # defined in a function: module-level CUDA kernels of the test files must have
    # example arguments in tests/test_cuda_verdict.py
    @cuda.jit
    def square_own(x, y):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = y[i] * x[i]       # in place at the thread's own element: a cell

    @cuda.jit
    def scratch(x, y):
        t = cuda.local.array(2, types.float64)
        i = cuda.grid(1)
        if i < x.shape[0]:
            t[0] = x[i]
            t[1] = t[0] * t[0]
            y[i] = t[1]
    return square_own, scratch


square_own, scratch = _cuda_kernels()
ARGS = (np.linspace(0.0, 1.0, 8), np.zeros(8), 0.25)
CPU, CUDA = targets.get("cpu"), targets.get("cuda")


def _types(target, dispatcher, args):
    return tuple(target.typeof(dispatcher, a) for a in args)


def test_stage_list():
    assert pipeline.STAGES == ("typed", "region", "plan", "prepared", "facts", "source",
                               "compiled")


def test_every_stage_of_a_cpu_kernel():
    out = pipeline.stages(CPU, heat, _types(CPU, heat, ARGS), until="compiled")
    assert list(out) == list(pipeline.STAGES)
    assert out["typed"].name == "heat" and out["typed"].target == "cpu"
    region = out["region"]
    assert isinstance(region, ir.Kernel) and region.args == ("u", "u_new", "alpha")
    loops = [s for s in ir.walk(region.body) if isinstance(s, ir.ForRange)]
    assert len(loops) == 1 and loops[0].index == "i"
    assert ir.stored_arrays(region.body) == {"u_new"}
    plan = out["plan"]
    assert plan.adjoint_names() == ("adj_u", "adj_u_new", "adj_alpha")
    assert plan.written == {1} and plan.read == {0} and not plan.returns_value
    assert out["prepared"].kernel is region and not out["prepared"].analysis
    facts = out["facts"]
    assert set(facts.slot_args) == {"u", "u_new", "alpha"}
    assert "alpha" in facts.varied and "u" in facts.varied_arrays
    src = out["source"].adjoint.source
    assert "\ndef heat_adjoint(" in "\n" + src and "adj_alpha" in src
    assert out["compiled"].source == src
    assert src == kadj.differentiate(heat).adjoint_source(*ARGS)


def test_until_stops_early_and_counts_runs():
    before = dict(pipeline.RUNS)
    out = pipeline.stages(CPU, heat, _types(CPU, heat, ARGS), until="facts")
    assert list(out) == ["typed", "region", "plan", "prepared", "facts"]
    ran = {k: pipeline.RUNS[k] - before.get(k, 0) for k in pipeline.STAGES}
    assert ran == {"typed": 1, "region": 1, "plan": 1, "prepared": 1, "facts": 1,
                   "source": 0, "compiled": 0}
    k = kadj.differentiate(heat, wrt=("alpha",))
    plan = k.stages(*ARGS, until="plan")["plan"]           # the kernel's own request
    assert plan.adjoint_names() == ("adj_u_new", "adj_alpha")
    with pytest.raises(ValueError, match="until must be one of"):
        pipeline.stages(CPU, heat, _types(CPU, heat, ARGS), until="lowered")


def test_a_returned_value_is_in_the_plan():
    plan = pipeline.stages(CPU, total, _types(CPU, total, (np.ones(3),)),
                           until="plan")["plan"]
    assert plan.returns_value and plan.adjoint_names() == ("adj_x",)


def test_cuda_preparation_cells_and_memory_policy():
    args = (np.ones(8), np.ones(8))
    out = pipeline.stages(CUDA, square_own, _types(CUDA, square_own, args),
                          until="source")
    prepared = out["prepared"]
    assert prepared.extra["cells"] and "y" in prepared.analysis["unwritten"]
    assert prepared.analysis["carried_replay"] is True
    # the cell rewrite changes the tree, not the plan: y is written by the kernel
    assert out["plan"].written == {1}
    assert ir.stored_arrays(out["region"].body) == {"y"}
    assert set(out["source"].sources()) == {"adjoint"} | set(out["source"].forms)
    out = pipeline.stages(CUDA, scratch, _types(CUDA, scratch, args), until="prepared")
    (local,) = out["prepared"].analysis["private_scratch"]
    assert out["prepared"].extra["space"][local] == "local.array"
    assert not out["prepared"].analysis["shared_scratch"]


def test_a_target_without_returns_refuses_a_returned_value():
    # the CPU description, but for a target whose kernels cannot return values
    no_returns = type(CPU)(**{**{f: getattr(CPU, f) for f in CPU.__dataclass_fields__},
                              "returns_values": False, "title": "Device"})
    with pytest.raises(kadj.DifferentiationError, match="Device kernels cannot return"):
        pipeline.stages(no_returns, total, _types(CPU, total, (np.ones(3),)), until="plan")


@pytest.mark.parametrize("stage", pipeline.SHOWN)
def test_every_stage_prints(stage):
    k = kadj.differentiate(heat, gather=False)   # (the scatter form's adjoint IR)
    text = k.show_stage(stage, *ARGS)
    assert isinstance(text, str) and text.strip()
    expect = {"typed": "u_new", "region": "for i in range(1,", "plan": "adj_alpha",
              "prepared": "kernel heat(u, u_new, alpha):", "facts": "alpha",
              "adjoint-ir": "", "source": "def heat_adjoint(",
              "tangent": "def heat_jvp("}[stage]
    assert expect in text
    if stage == "region":
        assert text.startswith("kernel heat(u, u_new, alpha):")
    if stage == "adjoint-ir":
        try:
            from kadj import adj_ir
        except ImportError:
            adj_ir = None
        if adj_ir is not None and hasattr(adj_ir, "capture"):
            assert text.startswith("# ---- scatter ----\n")
            assert "heat_adjoint" in text and "ReverseLoop" in text
        else:
            assert "not available" in text and "--stage source" in text


def test_show_stage_of_a_cuda_kernel_prints_every_form():
    k = kadj.differentiate(square_own)
    args = (np.ones(8), np.ones(8))
    text = k.show_stage("source", *args)
    forms = 3 if k.compiled(*args).gather is not None else 1
    assert text.count("def square_own_adjoint") == forms
    headers = [ln for ln in text.splitlines() if ln.startswith("# ---- ")]
    assert len(headers) == (forms if forms > 1 else 0)   # one form: printed as is
    ir_text = k.show_stage("adjoint-ir", *args)
    assert "not available" in ir_text or forms == len(
        [ln for ln in ir_text.splitlines() if ln.startswith("# ---- ")])
    policy = k.show_stage("prepared", *args)
    assert "# analysis policy:" in policy and "carried_replay = True" in policy


def test_command_line_stage(tmp_path):
    (tmp_path / "stagemod.py").write_text(
        "from numba import njit\n\n@njit\n"
        "def scale(x, y, a):\n    for i in range(x.shape[0]):\n        y[i] = a * x[i]\n")
    env = dict(os.environ, PYTHONPATH=ROOT, KADJ_CACHE_DIR=str(tmp_path / "cache"))
    base = [sys.executable, "-m", "kadj", "show", "stagemod:scale",
            "--args", "np.zeros(4), np.zeros(4), 2.0"]
    region = subprocess.run(base + ["--stage", "region"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert region.returncode == 0, region.stderr
    assert region.stdout.startswith("kernel scale(x, y, a):")
    assert "y[i] = " in region.stdout and "for i in range(" in region.stdout
    bad = subprocess.run(base + ["--stage", "lowered"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "invalid choice" in bad.stderr
