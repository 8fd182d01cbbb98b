"""CUDA adjoints in kadj's disk cache ($KADJ_CACHE_DIR, kadj/codegen.py).

A second process that differentiates the same ``@cuda.jit`` kernel for the same
argument types loads the adjoint (every form: scatter, gather, zero; the report; the
launch dimensions) from the cache: the pipeline's stages do not run again (no typing,
no structuring), and the loaded adjoint gives the same gradient, checked against the
analytic adjoint of the stencil (and of a sigmoid computed by a device function).  Under the simulator (NUMBA_ENABLE_CUDASIM=1) the
adjoint also runs; without it (numba-cuda's own typing) generation alone is checked,
and the two typing paths give the same sources.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNELS = '''
import math

from numba import cuda

@cuda.jit
def heat_step(u, u_new, alpha):
    i = cuda.grid(1)
    if i >= 1 and i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@cuda.jit(device=True)
def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


@cuda.jit
def activate(x, y):     # a device function, and threadIdx.x (a property of numba's stub)
    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i < x.shape[0]:
        y[i] = _sigmoid(x[i])
'''

CHILD = '''
import json, sys
import numpy as np
import kadj
import kadj.cuda.frontend
import kadj.cuda.structure
from kadj import pipeline
import cudaheat

calls = {"type_kernel": 0, "structurize_cuda": 0}


def counted(mod, name):
    orig = getattr(mod, name)

    def wrapper(*a, **kw):
        calls[name] += 1
        return orig(*a, **kw)
    setattr(mod, name, wrapper)


counted(kadj.cuda.frontend, "type_kernel")
counted(kadj.cuda.structure, "structurize_cuda")

k = kadj.differentiate(cudaheat.heat_step)
n = 10
u = np.linspace(0.0, 1.0, n) ** 2
u_new = np.zeros(n)
args = (u, u_new, 0.3)
comp = k.compiled(*args)
x = np.linspace(-2.0, 2.0, n)
act = kadj.differentiate(cudaheat.activate)
act_comp = act.compiled(x, np.zeros(n))
out = {"runs": dict(pipeline.RUNS), "calls": dict(calls), "disk_cached": comp.disk_cached,
       "sources": {f: k.adjoint_source(*args, form=f) for f in ("scatter", "gather", "zero")},
       "report": json.loads(json.dumps(k.adjoint_report(*args), default=str)),
       "dims": comp.dims, "plan": comp.plan.adjoint_names()}
out["act_disk_cached"] = act_comp.disk_cached
out["act_source"] = act.adjoint_source(x, np.zeros(n))
if RUN:
    adj_u, adj_u_new, adj_alpha = np.zeros(n), np.arange(1.0, n + 1.0), np.zeros(1)
    k[1, n](*args)
    k.adjoint[1, n](*args, adj_u, adj_u_new, adj_alpha)
    out["grad"] = [adj_u.tolist(), adj_u_new.tolist(), adj_alpha.tolist()]
    adj_x, adj_y = np.zeros(n), np.ones(n)
    act.adjoint[1, n](x, np.zeros(n), adj_x, adj_y)
    out["act_grad"] = adj_x.tolist()
    out["calls_before_typed"] = dict(calls)
    out["typed"] = comp.typed is not None       # typed again on demand when loaded
    out["calls_after_typed"] = dict(calls)
print("KADJ-RESULT " + json.dumps(out))
'''


def _child(tmp_path, cache, simulator):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(KADJ_CACHE_DIR=str(cache), NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    code = f"RUN = {simulator}\n" + textwrap.dedent(CHILD)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("KADJ-RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("KADJ-RESULT "):])


def _reference(n=10, alpha=0.3):
    """Analytic adjoint of heat_step for the cotangent 1..n of u_new."""
    u = np.linspace(0.0, 1.0, n) ** 2
    w = np.arange(1.0, n + 1.0)
    J = np.zeros((n, n))
    for i in range(1, n - 1):
        J[i, i - 1], J[i, i], J[i, i + 1] = alpha, 1.0 - 2.0 * alpha, alpha
    adj_u = J.T @ w
    adj_alpha = sum(w[i] * (u[i - 1] - 2.0 * u[i] + u[i + 1]) for i in range(1, n - 1))
    adj_u_new = w.copy()
    adj_u_new[1:n - 1] = 0.0      # overwritten by the kernel
    return adj_u, adj_u_new, np.array([adj_alpha])


@pytest.fixture
def module(tmp_path):
    (tmp_path / "cudaheat.py").write_text(KERNELS)
    return tmp_path


def _assert_built(r):
    assert r["runs"].get("typed") == 2 and r["runs"].get("region") == 2, r["runs"]
    assert r["calls"] == {"type_kernel": 2, "structurize_cuda": 2}, r["calls"]
    assert r["act_disk_cached"], "the kernel with a device function was not disk-cached"
    assert r["runs"].get("loaded", 0) == 0
    assert r["disk_cached"], "the first process did not write the adjoint to the cache"


def _assert_loaded(r):
    for stage in ("typed", "region", "facts", "source"):
        assert r["runs"].get(stage, 0) == 0, f"stage {stage} ran again: {r['runs']}"
    assert r["runs"].get("loaded") == 2, r["runs"]
    assert r["calls"] == {"type_kernel": 0, "structurize_cuda": 0}, r["calls"]


def test_second_process_loads_the_cuda_adjoint_under_the_simulator(module):
    cache = module / "kadj_cache"
    first = _child(module, cache, simulator=True)
    second = _child(module, cache, simulator=True)
    _assert_built(first)
    _assert_loaded(second)
    # launching the loaded adjoint types nothing; the typed kernel is rebuilt only
    # when asked for (kadj.cuda.verdict)
    assert second["calls_before_typed"] == {"type_kernel": 0, "structurize_cuda": 0}
    assert second["typed"] and second["calls_after_typed"]["type_kernel"] == 1
    assert first["calls_after_typed"]["type_kernel"] == 2   # kept from the build
    for key in ("sources", "report", "dims", "plan"):
        assert second[key] == first[key], key
    assert first["report"]["gather"]["used"], "the stencil should have a gather form"
    ref = _reference()
    for got in (first["grad"], second["grad"]):
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    x = np.linspace(-2.0, 2.0, 10)
    sig = 1.0 / (1.0 + np.exp(-x))
    for got in (first["act_grad"], second["act_grad"]):
        np.testing.assert_allclose(got, sig * (1.0 - sig), rtol=1e-12)
    assert second["act_source"] == first["act_source"]
    assert len(list(cache.glob("adj_*.json"))) == 2

    # the device function changes: its caller's adjoint is regenerated, never stale;
    # the stencil's lines did not change: its entry is used as it is
    path = module / "cudaheat.py"
    path.write_text(path.read_text().replace("math.exp(-v)", "math.exp(-2.0 * v)"))
    third = _child(module, cache, simulator=True)
    assert third["runs"].get("loaded") == 1 and third["runs"].get("typed") == 1, \
        third["runs"]
    assert third["sources"] == first["sources"]
    # the key covers the device function: a new entry for activate
    assert len(list(cache.glob("adj_*.json"))) == 3
    s2 = 1.0 / (1.0 + np.exp(-2.0 * x))
    np.testing.assert_allclose(third["act_grad"], 2.0 * s2 * (1.0 - s2), rtol=1e-12)

    # lines added above both kernels: both entries are used, the shown sources name
    # the kernels' new lines
    path.write_text("# added\n\n\n" + path.read_text())
    fourth = _child(module, cache, simulator=True)
    _assert_loaded(fourth)
    for form, text in third["sources"].items():
        moved = re.sub(r"cudaheat\.py:(\d+)", lambda m: f"cudaheat.py:{int(m.group(1)) + 3}",
                       text)
        assert "cudaheat.py:" in text and fourth["sources"][form] == moved, form
    assert fourth["grad"] == third["grad"]
    np.testing.assert_allclose(fourth["act_grad"], third["act_grad"], rtol=0, atol=0)


def test_second_process_loads_the_cuda_adjoint_without_the_simulator(module):
    cache = module / "kadj_cache"
    first = _child(module, cache, simulator=False)
    second = _child(module, cache, simulator=False)
    _assert_built(first)
    _assert_loaded(second)
    for key in ("sources", "report", "dims", "plan", "act_source"):
        assert second[key] == first[key], key
    # the same adjoint as the simulator's typing path generates
    sim = _child(module, module / "sim_cache", simulator=True)
    assert sim["sources"] == first["sources"]
    assert sim["act_source"] == first["act_source"]


def test_cuda_options_are_in_the_key():
    import kadj
    from kadj import pipeline, targets
    sys.path.insert(0, ROOT)
    from numba import cuda

    @cuda.jit
    def scale(x, y):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = 2.0 * x[i]

    gpu = targets.get("cuda")
    types_ = (kadj.targets.cuda._typeof(None, np.zeros(3)),) * 2
    keys = {pipeline.cache_key(gpu, pipeline.request(gpu, scale, types_, None, opts))
            for opts in ({}, {"gather": False}, {"checkpoints": 8})}
    assert len(keys) == 3
