"""The CUDA target: ``@cuda.jit`` kernels, adjoints compiled with ``numba.cuda.jit``.

Typing: numba-cuda's typing context, or under ``NUMBA_ENABLE_CUDASIM=1`` the simulator
shim (:mod:`kadj.cuda.frontend`); structure: kadj.structurize with the CUDA intrinsics
(:mod:`kadj.cuda.structure`); preparation: scalar cells for in-place updates of a
thread's own element (:mod:`kadj.cuda.cells`) and the memory space of each allocation
(local arrays are thread-private scratch, shared arrays block-shared, those every thread
writes only at its own element "owned"), handed to the analysis as its policy keywords;
writer: :mod:`kadj.cuda.writer` (scatter form, atomics where threads may collide) and
:mod:`kadj.cuda.gather` (the gather form of stencils).  The tape is bounded per thread
(checkpoint slots, option ``checkpoints``); contributions that threads may share are
atomic adds.  Compiled adjoints go through kadj's disk cache like the CPU's: a second
process neither re-types nor regenerates them.
"""
from __future__ import annotations

from dataclasses import dataclass

from numba.core import types

from .. import codegen, ir, typing_memo
from ..cuda import warp as _warp  # noqa: F401 (registers the warp shuffles' rules)
from ..cuda.intrinsics import TABLE as _INTRINSICS
from .base import DEFAULT_CHECKPOINTS, Prepared, Target, Written, checkpoint_slots

# numba-cuda types kernels with its own copy of numba's type inferer: its resolutions
# are remembered too while kadj compiles (kadj.typing_memo)
typing_memo.register("numba.cuda.core.typeinfer", "numba.cuda.types")

_JIT_OPTIONS_KEPT = ("fastmath", "debug", "lineinfo", "opt")
# DEFAULT_CHECKPOINTS: kadj.cuda.writer.DEFAULT_SLOTS (checked in tests)


@dataclass(frozen=True)
class CompiledCudaAdjoint:
    plan: object
    source: str
    pyfunc: object          # the adjoint as a plain Python function
    kernel: object          # cuda.jit(pyfunc)
    report: dict
    gather: object = None   # _Gather, when the kernel has a gather form
    typed_kernel: object = None   # the TypedKernel it was built from
    dims: tuple = ((), ())  # (block, grid) index dimensions the kernel reads
    retype: object = None   # () -> TypedKernel, for an adjoint loaded from disk
    disk_cached: bool = False

    @property
    def typed(self):
        """The typed kernel (kadj.cuda.verdict); typed again on first use when the
        adjoint came from the disk cache."""
        if self.typed_kernel is None and self.retype is not None:
            object.__setattr__(self, "typed_kernel", self.retype())
        return self.typed_kernel


@dataclass(frozen=True)
class _Gather:
    arrays: dict            # array -> (perm, offsets)
    arg_index: dict         # array -> argument position
    ndim: int
    sources: tuple          # (gather source, zero source)
    pyfuncs: tuple
    kernels: tuple
    slot_rows: int = 0      # rows of the trailing slots argument (kadj.cuda.slots)

    def covers(self, config, args):
        """Does the launch have a thread for every element of each gathered array?"""
        grid, block = _dims(config[0]), _dims(config[1])
        threads = [g * b for g, b in zip(grid, block)]
        for name, (perm, _) in self.arrays.items():
            shape = args[self.arg_index[name]].shape
            if any(threads[d] < shape[k] for k, d in enumerate(perm)):
                return False
        return True


def _dims(d):
    d = tuple(d) if isinstance(d, (tuple, list)) else (int(d),)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def _recognises(dispatcher):
    return hasattr(dispatcher, "py_func") and "cuda" in type(dispatcher).__module__


def _typeof(dispatcher, a):
    """numba type of a launch argument: NumPy and numba device arrays, scalars, and
    any object exporting ``__cuda_array_interface__`` (CuPy arrays)."""
    import numba
    try:
        return numba.typeof(a)
    except (ValueError, TypeError):
        if hasattr(a, "__cuda_array_interface__"):
            from numba import cuda
            return numba.typeof(cuda.as_cuda_array(a))
        raise


def jit_options(dispatcher):
    opts = getattr(dispatcher, "targetoptions", None) or {}
    return {k: opts[k] for k in _JIT_OPTIONS_KEPT if k in opts}


def _check_option(kernel_name, option, value):
    if option == "checkpoints":
        return checkpoint_slots(value)
    return bool(value)


def _type_kernel(dispatcher, arg_types):
    from ..cuda.frontend import type_kernel
    return type_kernel(dispatcher.py_func, arg_types)  # the same IR with or without simulator


def _structurize(typed):
    from ..cuda.structure import structurize_cuda
    return structurize_cuda(typed)


def _prepare(kernel, plan):
    """Cells, memory spaces and owned shared arrays -> the analysis' policy keywords."""
    from ..cuda.cells import insert_cells, owned_shared
    from ..cuda.indexing import ThreadIndex, array_accesses
    index = ThreadIndex.of(kernel)
    classes = {name: index.classify(name, idxs)
               for name, idxs in array_accesses(kernel).items()}
    params = {a for a in kernel.args if isinstance(kernel.types.get(a), types.Array)}
    kernel, cells = insert_cells(kernel, index, classes, params)
    from ..cuda.own_rows import attach, without_rows
    plain, (kernel, rows) = kernel, attach(kernel, cells)   # own rows, in place
    space = {st.target: getattr(st.expr.fn, "path", None)
             for st in ir.walk(kernel.body)
             if isinstance(st, ir.Assign) and isinstance(st.expr, ir.Alloc)}
    shared = {v for v, p in space.items() if p == "shared.array"}
    policy = dict(carried_replay=True,
                  private_scratch={v for v, p in space.items() if p == "local.array"},
                  shared_scratch=shared, owned_shared=set(owned_shared(kernel, shared)),
                  unwritten=set(cells))
    return Prepared(kernel, policy, {"cells": cells, "space": space, "own_rows": rows,
                                     "without_rows": without_rows(plain, policy, rows)})


def _write(prepared, facts, plan, options):
    from ..cuda.gather import gather_plan, write_gather
    from ..cuda.writer import write_cuda_adjoint
    kernel, cells = prepared.kernel, prepared.extra["cells"]
    slot_names = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    adj, report, writer = write_cuda_adjoint(kernel, facts, slot_names,
                                             slots=options["checkpoints"], cells=cells)
    index = writer.state.index
    from ..cuda.own_rows import report as rows_report
    extra = {"dims": (tuple(index.block_dims), tuple(index.grid_dims)), "gather": None}
    forms = {}
    if writer.state.rows is not None:
        report["own_rows"] = rows_report(writer, plan.arg_names)
        report["gather"] = {"used": False, "why": "a thread's own row, in place"}
        return Written(adj, forms, report, extra)
    from ..cuda.atomic_extrema import report as extrema_report
    extrema = extrema_report(kernel, plan.arg_names)
    if extrema:
        report["atomic_extrema"] = extrema
        report["gather"] = {"used": False, "why": "cuda.atomic.max/min in the kernel"}
        return Written(adj, forms, report, extra)
    if not options["gather"]:
        report["gather"] = {"used": False, "why": "disabled (gather=False)"}
        return Written(adj, forms, report, extra)
    gplan, why = gather_plan(kernel, facts, writer)
    if gplan is None:
        report["gather"] = {"used": False, "why": why}
        return Written(adj, forms, report, extra)
    forms["gather"], forms["zero"], rows = write_gather(kernel, facts, slot_names, gplan,
                                                        cells=cells)
    report["gather"] = {
        "used": "when the launch has a thread for every element of "
                + ", ".join(sorted(gplan)),
        "arrays": {n: sorted(offs) for n, (perm, offs) in sorted(gplan.items())},
        "passes": len({o for _, offs in gplan.values() for o in offs} |
                      {tuple([0] * index.ndim)}),
    }
    extra["gather"] = {"arrays": dict(gplan),
                       "arg_index": {n: plan.arg_names.index(n) for n in gplan},
                       "ndim": index.ndim, "slot_rows": rows}
    return Written(adj, forms, report, extra)


def _compiled(plan, report, extra, functions, jit_options, typed=None, retype=None,
              disk=False):
    """The compiled adjoint from ``functions``: {name: (source, Python function)}."""
    from numba import cuda
    jit = cuda.jit(**jit_options)
    names = list(functions)
    source, pyfn = functions[names[0]]
    gather = None
    g = extra.get("gather")
    if g is not None:
        parts = [functions[n] for n in names[1:3]]
        gather = _Gather(g["arrays"], g["arg_index"], g["ndim"],
                         tuple(s for s, _ in parts), tuple(f for _, f in parts),
                         tuple(jit(f) for _, f in parts), g["slot_rows"])
    dims = tuple(tuple(d) for d in extra["dims"])
    return CompiledCudaAdjoint(plan, source, pyfn, jit(pyfn), report, gather, typed, dims,
                               retype, disk)


def _compile(written, plan, typed, key, request):
    sources = [written.adjoint] + [written.forms[f] for f in ("gather", "zero")
                                   if f in written.forms]
    extra = dict(written.extra, report=written.report)
    pyfns, disk = codegen.build_many(sources, plan, key, codegen.source_files(typed.func_ir),
                                     extra, func_ir=typed.func_ir)
    functions = {s.name: (s.source, pyfns[s.name]) for s in sources}
    return _compiled(plan, written.report, written.extra, functions, request.jit_options,
                     typed=typed, disk=disk)


def _load(key, request):
    cached = codegen.load_many(key)
    if cached is None:
        return None
    plan, functions, extra = cached
    try:
        report = extra["report"]
        return _compiled(plan, report, extra, functions, request.jit_options, disk=True,
                         retype=lambda: _type_kernel(request.dispatcher, request.arg_types))
    except (KeyError, TypeError, ValueError, IndexError):  # an entry of another layout
        return None


def _write_tangent(prepared, facts, plan):
    """The tangent kernel's source: the host's tangent writer (:mod:`kadj.tangent`)
    with the CUDA target's spellings and lowerings (:func:`kadj.cuda.context.
    tangent_context`), on the prepared kernel (cells of a thread's own element)."""
    from ..cuda.context import tangent_context
    from ..tangent import write_tangent
    from ..cuda.own_rows import tangent_inputs
    prepared, facts = tangent_inputs(prepared, facts, plan)   # (forward mode: in place)
    slot_args = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    return write_tangent(prepared.kernel, facts, slot_args, False, tangent_context())


def _compile_tangent(plan, source, pyfunc, disk_cached, jit_options):
    from ..cuda.tangent import compile_tangent
    return compile_tangent(plan, source, pyfunc, disk_cached, jit_options)


CUDA = Target(
    name="cuda", title="CUDA", recognises=_recognises,
    kernel_class="kadj.cuda_api:CudaDifferentiatedKernel", typeof=_typeof,
    jit_options=jit_options, type_kernel=_type_kernel, structurize=_structurize,
    prepare=_prepare, write=_write, compile=_compile, load=_load,
    options={"checkpoints": DEFAULT_CHECKPOINTS, "gather": True},
    check_option=_check_option, returns_values=False, tape="bounded",
    accumulation="atomic", intrinsics=_INTRINSICS, write_tangent=_write_tangent,
    compile_tangent=_compile_tangent)
