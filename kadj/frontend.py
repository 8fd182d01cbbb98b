"""Frontend: a numba kernel plus concrete argument types -> typed Numba IR.

It runs numba's own untyped pipeline (bytecode -> IR, closure inlining, rewrites,
dead-branch pruning), then an extra pass that inlines every call to another jitted
function that has no registered derivative rule (so helpers are differentiated as part
of the kernel), then numba's type inference, and stops there.  SSA reconstruction is
off: kadj's reverse pass restores overwritten variables itself, and the user's variable
names stay as the user wrote them.

The result, :class:`TypedKernel`, holds ``func_ir``, ``typemap``, ``calltypes`` and the
return type; every callee is later resolved to its Python object from the IR.
"""
from __future__ import annotations

from dataclasses import dataclass

from numba.core import compiler, ir
from numba.core import typed_passes
from numba.core.compiler import CompilerBase, DefaultPassBuilder, Flags
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.ir_utils import simplify_CFG
from numba.core.analysis import compute_cfg_from_blocks
from numba.core import postproc

from . import rules
from .errors import DifferentiationError


@dataclass(frozen=True)
class TypedKernel:
    """Typed Numba IR of one kernel for one argument-type signature."""

    name: str
    py_func: object
    func_ir: object
    typemap: dict
    calltypes: dict
    return_type: object
    arg_names: tuple
    arg_types: tuple
    target: str  # "cpu" or "cuda"


def is_jitted(obj):
    """True for a numba dispatcher (CPU or CUDA) of a Python function."""
    return hasattr(obj, "py_func") and hasattr(obj, "targetoptions")


def resolve_value(func_ir, var):
    """The Python object a variable statically refers to (global, freevar, getattr
    chain, constant), or raise LookupError."""
    seen = 0
    while isinstance(var, ir.Var):
        seen += 1
        if seen > 50:
            raise LookupError(var)
        defn = func_ir.get_definition(var)
        if isinstance(defn, (ir.Global, ir.FreeVar, ir.Const)):
            return defn.value
        if isinstance(defn, ir.Expr) and defn.op == "getattr":
            base = resolve_value(func_ir, defn.value)
            return getattr(base, defn.attr)
        if isinstance(defn, ir.Var):
            var = defn
            continue
        raise LookupError(var)
    raise LookupError(var)


@register_pass(mutates_CFG=True, analysis_only=False)
class KadjInlineCallees(FunctionPass):
    """Inline every call to a jitted Python function that has no derivative rule."""

    _name = "kadj_inline_callees"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        from numba.core.inline_closurecall import InlineWorker, callee_ir_validator

        worker = InlineWorker(state.typingctx, state.targetctx, state.locals,
                              state.pipeline, state.flags, validator=callee_ir_validator)
        modified = False
        for _round in range(64):
            changed = False
            for label, block in list(state.func_ir.blocks.items()):
                for i, instr in enumerate(block.body):
                    if not (isinstance(instr, ir.Assign) and isinstance(instr.value, ir.Expr)
                            and instr.value.op == "call"):
                        continue
                    try:
                        callee = resolve_value(state.func_ir, instr.value.func)
                    except (LookupError, AttributeError, KeyError):
                        continue
                    if not is_jitted(callee) or rules.lookup(callee) is not None:
                        continue
                    if instr.value.kws or instr.value.vararg:
                        raise DifferentiationError(
                            "calls with keyword or star arguments to jitted helpers are "
                            "not supported",
                            kernel=state.func_id.func_name, loc=instr.loc,
                            construct=f"call to {callee.py_func.__name__}",
                            remedy="pass the helper's arguments positionally")
                    worker.inline_function(state.func_ir, block, i, callee.py_func)
                    changed = modified = True
                    break
                if changed:
                    break
            if not changed:
                break
        else:
            raise DifferentiationError(
                "helper functions nest too deeply (recursion?)",
                kernel=state.func_id.func_name, construct="recursive call",
                remedy="rewrite the recursion as a loop")
        if modified:
            cfg = compute_cfg_from_blocks(state.func_ir.blocks)
            for dead in cfg.dead_nodes():
                del state.func_ir.blocks[dead]
            postproc.PostProcessor(state.func_ir).run()
            state.func_ir.blocks = simplify_CFG(state.func_ir.blocks)
        return modified


class _FrontendPipeline(CompilerBase):
    def define_pipelines(self):
        pm = DefaultPassBuilder.define_untyped_pipeline(self.state)
        pm._finalized = False
        pm.add_pass(KadjInlineCallees, "kadj: inline jitted callees")
        pm.add_pass(typed_passes.NopythonTypeInference, "nopython frontend")
        pm.finalize()
        return [pm]


def _flags():
    flags = Flags()
    flags.enable_ssa = False
    flags.nrt = True
    return flags


def type_cpu_kernel(dispatcher, arg_types):
    """Typed IR of a CPU (@njit) dispatcher's function for ``arg_types``."""
    from numba.core.registry import cpu_target

    return _run(dispatcher.py_func, cpu_target.typing_context, cpu_target.target_context,
                arg_types, "cpu")


def _run(py_func, typingctx, targetctx, arg_types, target, flags=None, context=None):
    """Run the frontend pipeline; ``context`` is an optional context manager to run it in
    (the CUDA target override), ``flags`` replaces the CPU flags."""
    import contextlib

    with (context or contextlib.nullcontext()):
        pipeline = _FrontendPipeline(typingctx, targetctx, None, tuple(arg_types), None,
                                     flags or _flags(), {})
        pipeline.state.cr = None
        try:
            pipeline.compile_extra(py_func)
        except compiler.CompilerError as exc:  # raised once the lowering-less pipeline ends
            if "pipelines exhausted" not in str(exc):
                raise
    st = pipeline.state
    if st.get("typemap") is None:
        raise DifferentiationError("numba could not type the kernel",
                                   kernel=py_func.__name__)
    func_ir = st.func_ir
    return TypedKernel(
        name=py_func.__name__, py_func=py_func, func_ir=func_ir, typemap=dict(st.typemap),
        calltypes=dict(st.calltypes), return_type=st.return_type,
        arg_names=tuple(func_ir.arg_names), arg_types=tuple(arg_types), target=target)
