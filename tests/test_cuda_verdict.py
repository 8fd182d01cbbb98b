"""One verdict for the CUDA simulator and the GPU compiler.

Under ``NUMBA_ENABLE_CUDASIM=1`` kadj types CUDA kernels through its simulator shim,
otherwise through numba-cuda's typing context.  Both must give the same verdict
(accepted, or refused with the same message) and, where accepted, the same adjoint
source in every form.  This file runs itself as a script in two subprocesses, one with
the simulator and one without (and with different string-hash seeds), each describing
every CUDA kernel of the gallery (kernels/cuda), of the benchmark cases
(perf/cases_cuda.py) and of the test files with :func:`kadj.cuda.verdict.verdict` as
JSON; the tests compare the two descriptions.  The simulator process also checks the
gradients of this file's own kernels (check_grad_cuda, float64 central differences) and
the refusal adjoint_ptx() reports; the other compiles their adjoints to PTX when NVVM is
available.  The two processes take about 45 s on two cores: the comparison runs with
``-m slow`` (as CI does); the shim's typing of math runs by default.

Kernels of other test files are found by loading those files without their
module-level statements (skips, asserts): every module-level ``@cuda.jit`` kernel must
have example arguments in TEST_FILE_ARGS.
"""
import ast
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from numba import cuda, float64

import kadj

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# --------------------------------------------------------------------------------------
# kernels of this file (regressions; also part of the comparison)
# --------------------------------------------------------------------------------------


@kadj.differentiate
@cuda.jit
def tile2d_time_loop(u, out, nsteps):
    # each thread updates its own element of a 2-D shared tile in a time loop: numba's
    # constant inference takes the threadIdx attributes of s[tx, ty] for constants
    # (regression: accepted under the simulator, refused by numba-cuda's typing)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + tx
    j = cuda.blockIdx.y * cuda.blockDim.y + ty
    s = cuda.shared.array((4, 4), float64)
    s[tx, ty] = u[i, j]
    for t in range(nsteps):
        s[tx, ty] = s[tx, ty] * 0.9 + math.sin(s[tx, ty])
    out[i, j] = s[tx, ty]


@kadj.differentiate
@cuda.jit
def cell_overwritten_after_loop(x, out, m):
    # out[i]'s updates inside the replayed loop are dead (overwritten after it), but the
    # forward saves the element's cell before the loop (regression: the simulator
    # raised UnboundLocalError, the cell was read before being set)
    i = cuda.grid(1)
    if i < x.shape[0]:
        acc = x[i]
        for k in range(m):
            acc = math.sin(acc) + 0.5 * x[i]
            if acc > 0.0:
                out[i] += acc
        out[i] = x[i] * acc


@kadj.differentiate
@cuda.jit
def gridstride_select(x, y, out):
    # a conditional expression makes numba copy i ($phi = i) before out[i] += ...,
    # also inside a branch: still the thread's own element of the grid-stride loop
    # (regression: refused as an element other threads may touch)
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] += x[i] if x[i] > 0.0 else y[i] * y[i]
        if y[i] > 0.5:
            out[i] += x[i] * (x[i] if y[i] > 0.75 else 2.0)


@kadj.differentiate
@cuda.jit
def math_floor_index(x, y, out):
    # math.floor is a float64 in CUDA (an int64 on the CPU): the shim types it as CUDA
    i = cuda.grid(1)
    if i < x.shape[0]:
        f = math.floor(x[i])
        out[i] = (x[i] - f) * y[i]


@kadj.differentiate
@cuda.jit
def refused_atomic_max(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        for j in range(2):     # refused: the atomic's result (the old value) is used
            x[i] += cuda.atomic.max(y, j, x[i])


@kadj.differentiate
@cuda.jit
def refused_fma(x, y):
    # numba-cuda types cuda.fma, the shim an opaque stand-in: the structurizer refuses
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = cuda.fma(x[i], 2.0, 1.0)


@kadj.differentiate
@cuda.jit
def refused_shared_shape(x, y, n):
    # typing fails in both paths (a shared array needs a constant shape)
    s = cuda.shared.array(n, float64)
    i = cuda.grid(1)
    s[cuda.threadIdx.x] = x[i]
    y[i] = s[cuda.threadIdx.x]


COEF = np.array([0.5, -1.0, 2.0])


@kadj.differentiate
@cuda.jit
def const_table(x, y):
    # a module-level table through cuda.const.array_like: read as the table itself
    # (regression: refused, with another message under the simulator)
    i = cuda.grid(1)
    if i < x.shape[0]:
        c = cuda.const.array_like(COEF)
        y[i] = c[0] + x[i] * (c[1] + x[i] * c[2])


@kadj.differentiate
@cuda.jit
def refused_dynamic_shared(x, out):
    # dynamic shared memory: the adjoint's shared arrays would start at the same
    # address (regression: accepted, with a wrong gradient)
    sm = cuda.shared.array(0, float64)
    t = cuda.threadIdx.x
    sm[t] = x[t]
    cuda.syncthreads()
    out[t] = sm[(t + 1) % cuda.blockDim.x] ** 2


# name -> (kernel, (griddim, blockdim), make_args(rng)): gradient-checked in the
# simulator and compiled to PTX without it
OWN = {
    "tile2d_time_loop": (tile2d_time_loop, ((2, 2), (4, 4)),
                         lambda rng: [rng.random((8, 8)), np.zeros((8, 8)), 5]),
    "cell_overwritten_after_loop": (cell_overwritten_after_loop, (2, 8),
                                    lambda rng: [rng.random(13), rng.random(13), 3]),
    "gridstride_select": (gridstride_select, (2, 4),
                          lambda rng: [rng.random(13) - 0.5, rng.random(13),
                                       rng.random(13)]),
    "math_floor_index": (math_floor_index, (2, 8),
                         lambda rng: [rng.random(13) * 4.0 + 0.1, rng.random(13),
                                      np.zeros(13)]),
    "const_table": (const_table, (2, 8), lambda rng: [rng.random(13), np.zeros(13)]),
}
# name -> (kernel, make_args(rng), a phrase of the refusal)
REFUSED = {
    "refused_atomic_max": (refused_atomic_max, lambda rng: [rng.random(8), np.zeros(1)],
                           "the value returned by cuda.atomic.max"),
    "refused_fma": (refused_fma, lambda rng: [rng.random(8), np.zeros(8)],
                    "cuda.fma() is not supported"),
    "refused_shared_shape": (refused_shared_shape,
                             lambda rng: [rng.random(8), np.zeros(8), 8],
                             "numba cannot type this kernel for the CUDA target"),
    "refused_dynamic_shared": (refused_dynamic_shared,
                               lambda rng: [rng.random(8), np.zeros(8)],
                               "dynamic shared memory"),
}


# --------------------------------------------------------------------------------------
# every CUDA kernel of the tests and the gallery, with example arguments
# --------------------------------------------------------------------------------------

# Example arguments of the kernels of other test files, per file: a function of the
# loaded module -> {kernel name: arguments}.  A test file with a module-level
# ``@cuda.jit`` kernel and no entry here fails test_every_cuda_kernel_is_described.
def _sim_cases_args(m, r):
    # tests/cuda_sim_cases.py passes its arguments inline: the same shapes and types
    return {
        "heat_step": [r.random(13), np.zeros(13), 0.1],
        "laplace2d": [r.random((7, 6)), np.zeros((7, 6)), 0.7],
        "scaled_sin": [r.random(10), np.zeros(10), 1.3],
        "pointwise": [r.random(11), r.random(11), np.zeros(11)],
        "with_device_helper": [r.random(9), np.zeros(9), 0.3],
        "logistic": [r.random(6), r.random(6), 0.1, np.zeros(6), 37],
        "heat_step_scatter": [r.random(13), np.zeros(13), 0.1],
        "logistic_2slots": [r.random(6), r.random(6), 0.1, np.zeros(6), 37],
        "newton_sqrt": [r.random(6) + 0.5, np.zeros(6)],
        "capped_rows": [r.random((3, 5)), 1.0, np.zeros(3)],
        "gridstride_pendulum": [r.random(11), r.random(11), np.zeros(11), 0.1, 9],
        "nested_carry": [r.random(5), np.zeros(5), 3],
        "inner_reads_state": [r.random(7), np.zeros(7), 0.2],
        "push_inplace": [r.random(9), r.random(9), r.random(9), 0.1],
        "rk2_local_state": [r.random(5), r.random(5), np.zeros(5), 0.1, 6],
        "heat_bc": [r.random(12), np.zeros(12), 0.2],
        "sq_loss": [r.random(12), np.zeros(1)],
        "wrap_left": [r.random(16), np.zeros(16)],
        "thread_id_value": [r.random(16), np.zeros(16), r.random(2)],
        "coefficients": [r.random(11), r.random(3), np.zeros(11)],
        "burgers_upwind": [r.random(12) - 0.5, np.zeros(12), 0.1, 0.05],
        "tile_read_after_loop": [r.random(16), np.zeros(8)],
        "hostile_names": [r.random(7), np.zeros(7), r.random(7), 0.3, r.random(7),
                          np.zeros(7)],
        "relax_own_element": [r.random(9), 0.6],
        "overwritten_store": [r.random(16), np.zeros(16), 0.6],
        "dead_neighbour_read": [r.random(16), np.zeros(16), 0.6],
        "rows_rewritten_in_each_branch": [r.random(7), r.random((7, 3))],
        "helper_after_nested_return": [r.random(7), r.random(7)],
        "rebound_scalar": [r.random(9), 0.6],
        "two_loops_with_returns": [r.random(37), r.random(37), 0.6, 2],
        "strided_elements": [r.random(14), r.random(21), r.random(21), np.zeros(7),
                             np.zeros(14), 0.7],
        "block_sum_in_helper": [r.random(8), np.zeros(2)],
        "tile_in_each_arm": [r.random((6, 7)), r.random(7), np.zeros(6)],
        "row_scale": [r.random((10, 5)), r.random(5), np.zeros((10, 5))],
        "row_and_next": [r.random((10, 4)), np.zeros((10, 4))],
    }


TEST_FILE_ARGS = {
    "cuda_sim_cases": _sim_cases_args,
    "test_cuda_ptx": lambda m, r: {
        **{n: args for n, (k, args, _) in m.CASES.items()},
        "hostile_names": [r.random(8), np.zeros(8), r.random(8), 0.3, r.random(8),
                          np.zeros(8)],
        "row_norm": [r.random((4, 3)), np.zeros((4, 3))],
        "row_and_next": [r.random((4, 3)), np.zeros((4, 3))],
        "rows_2d_launch": [r.random((4, 3)), np.zeros((4, 2))],
        "heat_two_coefficients": [r.random(20), np.zeros(20), 0.1, 0.2],
        "conv3_f32": [r.random(20).astype(np.float32), np.zeros(20, np.float32),
                      np.float32(0.2), np.float32(0.5), np.float32(0.3)],
        "weight_by_lane": [r.random(16), r.random(8), np.zeros(16)]},
    "slots_cuda_sim": lambda m, r: {
        "heat1d": [r.random(12), np.zeros(12), 0.3],
        "heat2d_two": [r.random((6, 7)), np.zeros((6, 7)), 0.2, np.float32(0.1)]},
    "test_cuda_gpu": lambda m, r: {n: f(r)[2] for n, f in m.KERNELS.items()},
    "test_cuda_launch_dims": lambda m, r: m._args(r),
    "test_guarded_sums": lambda m, r: {"guard_inside": [r.uniform(-1, 1, 5),
                                                        r.uniform(0.5, 1, 5), np.zeros(5)]},
    "test_cuda_launch_cache": lambda m, r: {"heat_launch": [r.random(16), np.zeros(16), 0.3]},
    "test_adjoint_ir": lambda m, r: {n: f(r) for n, f in m.CUDA_ARGS.items()},
    "checkpointed_cuda_sim": lambda m, r: {
        "heat": [r.random(12), np.zeros(12), 0.1, r.random(12)],
        "blend": [r.random(12), r.random(12), np.zeros(12), r.random(12), 0.3],
        "init": [r.random(12), np.zeros(12)],
        "sqloss": [r.random(12), r.random(12), np.zeros(1)]},
    "fingerprint_device_sim": lambda m, r: {
        "scale": [r.random(12), np.zeros(12), 0.5],
        "total": [r.random(12), np.zeros(1)]},
    "tape_sim_cases": lambda m, r: {
        "step": [r.random(12), np.zeros(12), 0.1],
        "product": [r.random(12), r.random(12), r.random(12), np.zeros(12)],
        "loss_k": [r.random(12), r.random(12), np.zeros(1)]},
    "test_stages": lambda m, r: {
        "cuda_carried": [r.random(16), np.zeros(16), 3],
        "cuda_block_sum": [r.random(16), np.zeros(1)],
        "cuda_tiled_dot": [r.random(16), r.random(4), np.zeros(16)],
        "cuda_local_stages": [r.random(16), np.zeros(16)],
        "cuda_square_own": [r.random(16)]},
    "scratch_loops_cuda_sim": lambda m, r: {
        "local_stages_per_step": [r.uniform(-1.0, 1.0, 7), np.zeros(7), 0.2],
        "local_partial_sums": [r.uniform(-1.0, 1.0, 7), r.uniform(0.2, 0.8, 3),
                               np.zeros(7)]},
    "mixed_types_cuda_sim": lambda m, r: {"int_or_float": [r.random(8), np.zeros(8)]},
    "loop_exits_cuda_sim": lambda m, r: {
        "newton_and_stop": [r.random(6) + 0.5, np.zeros(6)],
        "damped_exits": [r.random(6) - 0.5, np.zeros(6)],
        "checked_scale": [r.random(7), np.zeros(7), 0.7]},
    "test_lowerings": lambda m, r: {
        "logistic": m._logistic_args(),
        "tile_sum": [r.random(16), np.zeros(1)],
        "heat1d": [r.random(16), np.zeros(16), 0.1]},
    "jvp_cuda_sim": lambda m, r: {"atomic_sub_squares": m._atomic_sub_case(r)[1]},
    "first_push_cuda_sim": lambda m, r: {"steps_fresh": [r.random(7) - 0.5, np.zeros(7)],
                                         "nested_fresh": [r.random(7) - 0.5, np.zeros(7)]},
    "warp_cuda_sim": lambda m, r: {n: make(r) for n, (k, _, make) in m.CASES.items()},
    "atomic_extrema_cuda_sim": lambda m, r: {k.__name__: make(r) for n, (k, _, make) in
                                             m.CASES.items()},
    "own_rows_cuda_sim": lambda m, r: {
        **{n: make(r) for n, (k, _, make) in m.CASES.items()},
        **{n: make(r, 7) for n, (k, make) in m.FAMILY.items()},
        **{n: make(r) for n, (k, make) in m.REFUSED.items()}},
    "test_cuda_atomic_extrema": lambda m, r: {
        n: [r.random(8) for _ in range(3 if n == "uses_result" else 2)] for n in (
            "uses_result", "nan_max", "two_on_one", "in_loop", "on_shared",
            "target_read", "in_device_function")},
    "test_cuda_warp": lambda m, r: {n: [r.random(8), np.zeros(8)] for n in (
        "shuffle_under_branch", "shuffle_in_thread_loop", "shuffle_after_early_return",
        "shuffle_partial_mask", "shuffle_under_half_warp", "shuffle_under_2d_warp_id")},
    "checkerboard_cuda_sim": lambda m, r: {
        **{n: make(r) + [1] for n, (k, make, _) in m.KERNELS.items()},
        **{n: make(r) for n, (k, make) in m.REFUSED.items()}},
    "votes_cuda_sim": lambda m, r: {k.__name__: make(r) for n, (k, _, make) in
                                    m.CASES.items()},
    "shared_tiles_cuda_sim": lambda m, r: {
        **{n: make(r) for n, (k, _, make) in m.CASES.items()},
        **{n: make(r) for n, (k, make) in m.REFUSED.items()}},
    "complex_cuda_sim": lambda m, r: {n: f(r)[2] for n, f in {**m.CASES,
                                                                **m.REFUSED}.items()},
    "test_singular": lambda m, r: {"cuda_families": [r.random(9), r.random(9),
                                                     np.zeros(9)],
                                   "cuda_ptx_families": [r.random(9), r.random(9),
                                                         np.zeros(9)]},
    "test_select_intrinsic": lambda m, r: {"_sqrt_cuda": [r.random(8) + 0.5, np.zeros(8)]},
}


def _has_cuda_kernels(path):
    """Does the file define a ``@cuda.jit`` kernel (not a device function) at module
    level?"""
    for st in ast.parse(open(path).read(), path).body:
        if isinstance(st, ast.FunctionDef):
            for dec in st.decorator_list:
                text = ast.unparse(dec)
                if "cuda.jit" in text and "device=True" not in text:
                    return True
    return False


def load_definitions(path, name):
    """The module at ``path`` with only its imports, definitions and assignments run
    (no module-level skips or asserts), so that a test file's kernels load with or
    without the simulator."""
    tree = ast.parse(open(path).read(), path)
    keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
            ast.AnnAssign)
    tree.body = [st for st in tree.body if isinstance(st, keep)]
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(tree, path, "exec"), module.__dict__)
    return module


def _cuda_kernels(module):
    """{name: differentiated kernel} of a module's ``@cuda.jit`` kernels (device
    functions left out)."""
    from kadj.cuda_api import CudaDifferentiatedKernel
    out = {}
    for name, obj in vars(module).items():
        if isinstance(obj, CudaDifferentiatedKernel):
            out[name] = obj
        elif hasattr(obj, "py_func") and "cuda" in type(obj).__module__ and \
                not getattr(obj, "_device", False) and \
                not getattr(obj, "targetoptions", {}).get("device", False):
            out[name] = kadj.differentiate(obj)
    return out


def all_kernels():
    """[(name, kernel, args)] for every CUDA kernel of the gallery, of the benchmark
    cases and of the test files; a kernel without example arguments has ``args``
    None."""
    sys.path[:0] = [p for p in (ROOT, HERE) if p not in sys.path]
    from kernels.cuda import all_cases
    from perf.cases_cuda import CASES as PERF
    rng = np.random.default_rng(0)
    out = [(f"gallery.{c.name}", c.kernel, c.make_args(rng)) for c in all_cases()]
    out += [(f"perf.{c.name}", c.kernel, c.make_args(c.size("check"), rng)) for c in PERF]
    mine = os.path.basename(__file__)
    for fname in sorted(os.listdir(HERE)):
        path = os.path.join(HERE, fname)
        if not fname.endswith(".py") or fname == mine or not _has_cuda_kernels(path):
            continue
        stem = fname[:-3]
        module = load_definitions(path, f"_kadj_verdict_{stem}")
        table = TEST_FILE_ARGS.get(stem)
        args = table(module, rng) if table is not None else {}
        for name, k in sorted(_cuda_kernels(module).items()):
            out.append((f"{stem}.{name}", k, args.get(name)))
    rng = np.random.default_rng(0)
    out += [(f"own.{n}", k, make(rng)) for n, (k, _, make) in OWN.items()]
    out += [(f"own.{n}", k, make(rng)) for n, (k, make, _) in REFUSED.items()]
    return out


# --------------------------------------------------------------------------------------
# the script: one process per typing path
# --------------------------------------------------------------------------------------


def _checks():
    """The simulator: gradients of this file's kernels, and adjoint_ptx's refusal (a
    child process compiles); without it: their adjoints' PTX."""
    from kadj import DifferentiationError
    from kadj.cuda_api import _ptx_in_subprocess, simulator_enabled
    from kadj.testing import check_grad_cuda
    out = {}
    for name, (k, config, make) in OWN.items():
        args = make(np.random.default_rng(1))
        try:
            if simulator_enabled():
                res = check_grad_cuda(k, config, args)
                out[name] = f"OK max relative error {res.max_rel_error:.1e}"
            else:
                from cudatools import nvvm_available
                ok, why = nvvm_available()
                if not ok:
                    out[name] = f"SKIP {why}"
                    continue
                forms = ["scatter"] + (["gather", "zero"] if k.compiled(
                    *args).gather is not None else [])
                for form in forms:
                    ptx = k.adjoint_ptx(*args, cc=(9, 0), form=form)
                    if ".entry" not in ptx:
                        raise AssertionError(f"no .entry in the {form} PTX: {ptx[:200]}")
                out[name] = "OK"
        except Exception as exc:  # reported to the test
            out[name] = f"FAIL {type(exc).__name__}: {exc}"
    if simulator_enabled():
        k, make, _ = REFUSED["refused_atomic_max"]
        args = make(np.random.default_rng(1))
        texts = []
        for call in (lambda: k.adjoint_source(*args), lambda: k.adjoint_ptx(*args),
                     lambda: _ptx_in_subprocess(k, args, (9, 0), "scatter")):
            try:
                call()
                texts.append("accepted")
            except DifferentiationError as exc:
                texts.append(str(exc))
        out["ptx_refusal"] = texts
    return out


def _dump(path):
    from kadj.cuda.verdict import verdict
    result = {"kernels": {}, "checks": _checks()}
    for name, k, args in all_kernels():
        if args is None:
            result["kernels"][name] = {"verdict": "no example arguments"}
            continue
        try:
            result["kernels"][name] = verdict(k, args)
        except Exception as exc:  # not a verdict: the description itself failed
            result["kernels"][name] = {"verdict": "error",
                                       "message": f"{type(exc).__name__}: {exc}"}
    with open(path, "w") as f:
        json.dump(result, f)


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------

# different string-hash seeds in the two processes: numba's IR must not carry the
# order of a set of strings into the adjoint either
RUNS = {"simulator": {"NUMBA_ENABLE_CUDASIM": "1", "PYTHONHASHSEED": "1"},
        "numba-cuda": {"NUMBA_ENABLE_CUDASIM": None, "PYTHONHASHSEED": "2"}}


def _run(label, tmp):
    env = dict(os.environ)
    for key, value in RUNS[label].items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, env.get("PYTHONPATH", "")])
    env["KADJ_CACHE_DIR"] = str(tmp / f"cache_{label}")
    path = tmp / f"{label}.json"
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(path)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0 or not path.exists():
        pytest.fail(f"the {label} process failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"simulator": description, "numba-cuda": description}, run side by side."""
    from concurrent.futures import ThreadPoolExecutor
    tmp = tmp_path_factory.mktemp("cuda_verdict")
    with ThreadPoolExecutor(2) as pool:
        futures = {label: pool.submit(_run, label, tmp) for label in RUNS}
        return {label: f.result() for label, f in futures.items()}


@pytest.mark.slow
def test_every_cuda_kernel_is_described(runs):
    for label, run in runs.items():
        kernels = run["kernels"]
        missing = sorted(n for n, d in kernels.items()
                         if d["verdict"] == "no example arguments")
        assert not missing, f"add example arguments for {missing} ({__file__})"
        groups = {n.split(".")[0] for n in kernels}
        assert {"gallery", "perf", "own", *TEST_FILE_ARGS} <= groups, groups
        assert sum(n.startswith("gallery.") for n in kernels) >= 40
        assert sum(n.startswith("cuda_sim_cases.") for n in kernels) == len(
            _sim_cases_args(None, np.random.default_rng(0)))
        errors = {n: d["message"] for n, d in kernels.items() if d["verdict"] == "error"}
        assert not errors, f"{label}: {errors}"
    assert runs["simulator"]["kernels"].keys() == runs["numba-cuda"]["kernels"].keys()


def _difference(name, sim, gpu):
    import difflib
    for field in ("verdict", "message", "gather"):
        if sim.get(field) != gpu.get(field):
            return (f"{name}: {field} differs\n  simulator:  {sim.get(field)!r}\n"
                    f"  numba-cuda: {gpu.get(field)!r}")
    sa, sb = sim.get("sources", {}), gpu.get("sources", {})
    for form in sorted(set(sa) | set(sb)):
        a, b = sa.get(form, ""), sb.get(form, "")
        if a != b:
            diff = difflib.unified_diff(a.splitlines(), b.splitlines(), "simulator",
                                        "numba-cuda", lineterm="", n=2)
            return f"{name}: the {form} adjoint differs\n" + "\n".join(list(diff)[:60])
    ta, tb = sim.get("types", {}), gpu.get("types", {})
    if ta != tb:
        diff = {v: (ta.get(v), tb.get(v)) for v in sorted(set(ta) | set(tb))
                if ta.get(v) != tb.get(v)}
        return f"{name}: typed differently (simulator, numba-cuda): {diff}"
    return None


@pytest.mark.slow
def test_simulator_and_compiler_give_one_verdict_and_adjoint(runs):
    sim, gpu = runs["simulator"]["kernels"], runs["numba-cuda"]["kernels"]
    diffs = [d for d in (_difference(n, sim[n], gpu.get(n, {})) for n in sorted(sim))
             if d]
    assert not diffs, f"{len(diffs)} of {len(sim)} kernels differ:\n\n" + \
        "\n\n".join(diffs)
    # the comparison covers both outcomes and the gather form
    assert {"accepted", "refused"} <= {d["verdict"] for d in sim.values()}
    assert any("gather" in d.get("sources", {}) for d in sim.values())


@pytest.mark.slow
def test_regressions_accepted_alike(runs):
    for label, run in runs.items():
        kernels = run["kernels"]
        for name in OWN:
            assert kernels[f"own.{name}"]["verdict"] == "accepted", (
                label, kernels[f"own.{name}"]["message"])
        for name, (_, _, phrase) in REFUSED.items():
            d = kernels[f"own.{name}"]
            assert d["verdict"] == "refused" and phrase in d["message"], (label, d)
    # the tile is indexed by the thread's own element: no copies of the index and no
    # atomics on it
    src = runs["numba-cuda"]["kernels"]["own.tile2d_time_loop"]["sources"]["scatter"]
    assert "adj_s[tx, ty] += " in src and "atomic.add(adj_s" not in src, src
    # a grid-stride loop's own element is private: no atomics on adj_out
    src = runs["numba-cuda"]["kernels"]["own.gridstride_select"]["sources"]["scatter"]
    assert "cuda.atomic" not in src, src


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OWN))
def test_regression_gradients_in_simulator(runs, name):
    status = runs["simulator"]["checks"][name]
    assert status.startswith("OK"), status


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OWN))
def test_regression_adjoints_compile_to_ptx(runs, name):
    status = runs["numba-cuda"]["checks"][name]
    if status.startswith("SKIP"):
        pytest.skip(status)
    assert status == "OK", status


def test_shim_types_math_as_numba_cuda():
    """kadj.cuda.shim_math copies numba-cuda's math declarations: the same result type
    for every declared function and argument types (floor of a float is a float)."""
    import itertools

    from numba.core import types as nt

    from kadj.cuda.frontend import simulator_enabled
    if simulator_enabled():
        pytest.skip("numba-cuda's typing modules are not importable under the simulator")
    from numba.cuda import cudamath
    from numba.cuda.utils import numba_target_override

    from kadj.cuda.frontend import contexts
    from kadj.cuda.shim import typing_context

    def result(ctx, fn, args):
        try:
            sig = ctx.resolve_function_type(ctx.resolve_value_type(fn), args, {})
        except Exception:  # numba: no match
            return None
        return None if sig is None else sig.return_type

    shim, real = typing_context(), contexts()[0]
    scalars = (nt.float32, nt.float64, nt.int32, nt.int64, nt.uint64)
    functions = [fn for fn, _ in cudamath.registry.globals]
    assert len(functions) >= 40
    checked = 0
    with numba_target_override():
        real.refresh()
        for fn in functions:
            for n in (1, 2):
                for args in itertools.product(scalars, repeat=n):
                    want = result(real, fn, args)
                    assert result(shim, fn, args) == want, (fn, args, want)
                    checked += want is not None
    assert checked > 100


@pytest.mark.slow
def test_adjoint_ptx_refusal_is_complete_under_simulator(runs):
    in_process, ptx, child = runs["simulator"]["checks"]["ptx_refusal"]
    assert "cuda.atomic.max" in in_process and "What you can do" in in_process
    assert "test_cuda_verdict.py:" in in_process and "^" in in_process
    # adjoint_ptx refuses with the compiler's verdict, and a refusal in the child
    # process that compiles comes back whole (it was its last line, a caret)
    assert ptx == in_process
    assert child == in_process


if __name__ == "__main__":
    _dump(sys.argv[1])


def test_dynamic_shared_memory_is_refused_and_const_tables_compile():
    """Without the simulator (the two-process comparison above checks both paths,
    with -m slow): dynamic shared memory is refused at its line, and a
    cuda.const.array_like table compiles to PTX."""
    from cudatools import nvvm_available
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    with pytest.raises(kadj.DifferentiationError, match="dynamic shared memory") as info:
        refused_dynamic_shared.adjoint_ptx(np.ones(8), np.zeros(8), cc=(9, 0))
    assert info.value.loc is not None and info.value.construct == "dynamic shared memory"
    assert ".entry" in const_table.adjoint_ptx(np.ones(8), np.zeros(8), cc=(9, 0))
