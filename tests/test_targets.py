"""Target descriptions (kadj/targets/), the import graph, and options refused.

- the registry picks the target of a dispatcher (``@njit`` -> cpu, ``@cuda.jit`` -> cuda)
  and each description says what the target supports;
- kadj's import graph, function-level imports included, has no cycle, and api.py and
  cuda_api.py do not import each other;
- only the targets' own package and kadj/cuda/ name the CUDA kernel machinery when an
  adjoint is built (the pipeline and the kernel object do not);
- no module outside kadj/targets/ and kadj/cuda/ names CUDA, barriers or shared memory
  in code (the host/device array seam and the CUDA kernel object excepted, listed);
- an option a target does not support is a clear error, never ignored.
"""
from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import numpy as np
import pytest
from numba import cuda, njit

import kadj
from kadj import pipeline, targets

KADJ = pathlib.Path(kadj.__file__).resolve().parent


@njit
def axpy(x, y, a):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + y[i]


def _axpy_cuda():
    # defined in a function: module-level CUDA kernels of the test files must have
    # example arguments in tests/test_cuda_verdict.py
    @cuda.jit
    def axpy_cuda(x, y, a):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = a * x[i] + y[i]
    return axpy_cuda


axpy_cuda = _axpy_cuda()


# ---- the import graph ----------------------------------------------------------------------
def _module_name(path):
    rel = path.relative_to(KADJ.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph():
    """{kadj module: kadj modules it imports}, every import statement included (also
    those inside functions), parsed with ast."""
    modules = {_module_name(p): p for p in KADJ.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets_ = []
            if isinstance(node, ast.Import):
                targets_ = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # a submodule imported by name, else the module itself
                targets_ = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod
                            for a in node.names]
            for t in targets_:
                if t in modules and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert "kadj.pipeline" in graph and "kadj.targets.cuda" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_api_and_cuda_api_do_not_import_each_other():
    graph = import_graph()
    assert "kadj.cuda_api" not in graph["kadj.api"]
    assert "kadj.api" not in graph["kadj.cuda_api"]


def test_pipeline_and_kernel_do_not_name_cuda():
    """The stages, the common kernel object and the public API reach CUDA only through
    the target: no import of, and no name from, the CUDA modules (their docstrings may
    still document the CUDA options)."""
    graph = import_graph()
    for name in ("kadj.pipeline", "kadj.kernel", "kadj.api"):
        assert not any(m.startswith("kadj.cuda") for m in graph[name]), (name, graph[name])
        assert "kadj.targets.cuda" not in graph[name]
        tree = ast.parse((KADJ / (name.split(".", 1)[1] + ".py")).read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names} | \
            {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not [u for u in used if "cuda" in u.lower()], name


# ---- the registry ----------------------------------------------------------------------------
def test_registry_picks_the_target_of_a_dispatcher():
    assert targets.for_dispatcher(axpy) is targets.get("cpu")
    assert targets.for_dispatcher(axpy_cuda) is targets.get("cuda")
    assert targets.for_dispatcher(axpy.py_func) is None
    with pytest.raises(LookupError, match="no kadj target named 'tpu'"):
        targets.get("tpu")


def test_descriptions():
    cpu, gpu = targets.get("cpu"), targets.get("cuda")
    assert (cpu.tape, gpu.tape) == ("growable", "bounded")
    assert (cpu.accumulation, gpu.accumulation) == ("plain", "atomic")
    assert cpu.supports("wrt") and gpu.supports("wrt")
    assert cpu.supports("gather") and cpu.supports("checkpoints")
    assert gpu.supports("gather") and gpu.supports("checkpoints")
    from kadj.cuda.writer import DEFAULT_SLOTS
    assert gpu.options == {"checkpoints": DEFAULT_SLOTS, "gather": True}
    assert cpu.returns_values and not gpu.returns_values
    assert isinstance(kadj.differentiate(axpy), targets.kernel_class(cpu))
    k = kadj.differentiate(axpy_cuda)
    assert isinstance(k, targets.kernel_class(gpu))
    assert isinstance(k, kadj.DifferentiatedKernel)     # one kernel object
    with pytest.raises(Exception):                       # frozen
        cpu.name = "other"
    with pytest.raises(ValueError, match="tape policy"):
        targets.Target(**{**{f: getattr(cpu, f) for f in cpu.__dataclass_fields__},
                          "tape": "infinite"})


def test_a_kernel_class_refuses_another_targets_kernel():
    from kadj.cuda_api import CudaDifferentiatedKernel
    with pytest.raises(TypeError, match="is a CUDA kernel, not a CPU one: differentiate "
                                        "it with kadj.differentiate"):
        kadj.DifferentiatedKernel(axpy_cuda)
    with pytest.raises(TypeError, match="is a CPU kernel, not a CUDA one"):
        CudaDifferentiatedKernel(axpy)
    with pytest.raises(TypeError, match="expects a numba @njit or @cuda.jit function"):
        kadj.differentiate(axpy.py_func)


def test_cuda_kernel_is_importable_where_it_was():
    from kadj.cuda_api import CudaDifferentiatedKernel
    assert isinstance(kadj.differentiate(axpy_cuda), CudaDifferentiatedKernel)
    assert kadj.api.DifferentiatedKernel is kadj.kernel.DifferentiatedKernel


# ---- options honoured or refused ---------------------------------------------------------
@pytest.mark.parametrize("value", [True, False])
def test_cpu_kernel_takes_the_gather_option(value):
    assert kadj.differentiate(axpy, gather=value).options["gather"] is value
    assert kadj.differentiate(gather=value)(axpy).options["gather"] is value
    again = kadj.differentiate(kadj.differentiate(axpy), gather=value)
    assert again.options["gather"] is value
    with pytest.raises(ValueError, match="gather must be True or False"):
        kadj.differentiate(axpy, gather="yes")


def test_options_not_given_are_the_defaults():
    k = kadj.differentiate(axpy)
    assert k.options == {"checkpoints": None, "parallel": None, "gather": None}  # (CPU: gather where cheap)
    c = kadj.differentiate(axpy_cuda)
    assert (c.checkpoints, c.gather) == (24, True)
    c = kadj.differentiate(axpy_cuda, checkpoints=6, gather=False)
    assert (c.checkpoints, c.gather) == (6, False)
    again = kadj.differentiate(c, wrt=("x",))       # options kept, wrt changed
    assert (again.checkpoints, again.gather, again.wrt) == (6, False, ("x",))
    assert kadj.differentiate(c) is c
    with pytest.raises(ValueError, match="positive number of slots"):
        kadj.differentiate(axpy_cuda, checkpoints=0)


def test_resolve_options_refuses_unknown_options():
    with pytest.raises(kadj.DifferentiationError, match="the option tiles= does not apply "
                                                        "to CUDA kernels"):
        pipeline.resolve_options(targets.get("cuda"), "k", {"tiles": 4})
    assert pipeline.resolve_options(targets.get("cuda"), "k", {"gather": None}) == \
        {"checkpoints": 24, "gather": True}


def test_gather_option_changes_the_cuda_adjoint():
    """gather=False is honoured: no gather form, and the report says why."""
    args = (np.ones(8), np.zeros(8), 0.5)
    on = kadj.differentiate(axpy_cuda)
    off = kadj.differentiate(axpy_cuda, gather=False)
    assert off.adjoint_report(*args)["gather"] == {"used": False,
                                                   "why": "disabled (gather=False)"}
    assert on.adjoint_report(*args)["gather"] != off.adjoint_report(*args)["gather"]


# ---- CUDA named only by the CUDA packages ------------------------------------------------
_CUDA_NAMES = re.compile(r"(?<![.@\w])cuda\s*\.|numba\s*\.\s*cuda|syncthreads|"
                         r"shared\s*\.\s*array")
# modules outside kadj/targets/ and kadj/cuda/ allowed to name CUDA, and why
_CUDA_ALLOWED = {
    "arrays.py": "the one host/device array seam (numba.cuda device arrays, CuPy)",
    "cuda_api.py": "the CUDA kernel object: launch syntax, PTX and resources",
    # the runtime's device layer talks to the CUDA driver by design; the code generator,
    # the analyses and the pipeline stay target-neutral
    "buffer_pool.py": "the pool of device adjoint buffers (device memory, events)",
    "device_ops.py": "the tape's small device kernels (add, hash)",
    "fingerprint.py": "device-side fingerprints of device arrays",
    "tape_streams.py": "the multi-stream backward (streams and events)",
    "mpi/device_slabs.py": "halo exchanges of device arrays (slab kernels, buffers)",
}


def code_lines(source):
    """(line number, text) of ``source`` without its comments and docstrings."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                skip.update(range(first.lineno, first.end_lineno + 1))
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return [(n, text) for n, text in enumerate(lines, 1) if n not in skip]


def cuda_named(source):
    return [(n, text.strip()) for n, text in code_lines(source) if _CUDA_NAMES.search(text)]


def test_cuda_named_only_by_the_cuda_packages():
    """No module outside kadj/targets/ and kadj/cuda/ names CUDA, barriers or shared
    memory in code (comments and docstrings may), except the listed ones."""
    found = {}
    for path in sorted(KADJ.rglob("*.py")):
        rel = path.relative_to(KADJ)
        # kadj/demo/ is an application of kadj (CPU and CUDA kernels), not the library
        if rel.parts[0] in ("targets", "cuda", "demo") or str(rel) in _CUDA_ALLOWED:
            continue
        hits = cuda_named(path.read_text())
        if hits:
            found[str(rel)] = hits
    assert not found, found


def test_cuda_name_finder():
    src = ('"""Docstring: cuda.syncthreads() is fine here."""\n'
           'from .cuda.frontend import x  # kadj.cuda is a package: cuda.grid here is fine\n'
           'MSG = "put @kadj.differentiate above @cuda.jit"\n'
           'def f():\n'
           '    """cuda.shared.array in a docstring"""\n'
           '    return "cuda.syncthreads()"\n'
           'A = sm.shared.array\n'
           'import numba.cuda\n')
    assert [n for n, _ in cuda_named(src)] == [6, 7, 8]
