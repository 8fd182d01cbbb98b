"""Frontend: a numba kernel plus concrete argument types -> typed Numba IR.

It runs numba's own untyped pipeline (bytecode -> IR, closure inlining, rewrites,
dead-branch pruning), then an extra pass that inlines every call to another jitted
function that has no registered derivative rule (so helpers are differentiated as part
of the kernel), then numba's type inference, and stops there.  SSA reconstruction is
off: kadj's reverse pass restores overwritten variables itself, and the user's variable
names stay as the user wrote them.  Typing without SSA gives a name one type for all
its values, and a copy ``k = i`` the type of ``k`` back to ``i``: where that fails (a
loop index reused for a float, ``k = i`` then ``k = 0.5 * x[i]`` in a loop, a float
then an array under one name), the kernel is typed again as numba types it, with SSA
(each assignment a version of its own, ``k.1``, ``k.2``, joined where control flow
meets), and the joins turned back into assignments (numba's ``PreLowerStripPhis``).

Refused here, with :class:`~kadj.DifferentiationError`: ``with`` blocks
(``numba.objmode`` above all; numba's with-lifting pass is replaced by
:class:`KadjWithBlocks`, in the kernel and in every inlined helper), recursion (a
helper reached again through its own chain of inlined calls, named with the cycle), and
generator functions.  Any number of calls to one helper, and helpers nested to any
depth, are inlined.

The result, :class:`TypedKernel`, holds ``func_ir``, ``typemap``, ``calltypes`` and the
return type; every callee is later resolved to its Python object from the IR.
"""
from __future__ import annotations

import copy
import inspect
import os
import threading
from dataclasses import dataclass

from numba.core import compiler, errors, ir, ir_utils
from numba.core import typed_passes, untyped_passes
from numba.core.compiler import CompilerBase, DefaultPassBuilder, Flags
from numba.core.compiler_machinery import FunctionPass, PassManager, register_pass
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
    #: why the kernel was typed with SSA (numba's error typing it without), else ""
    retyped: str = ""


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


_MAX_INLINED_CALLS = 4000
_current = threading.local()  # the kernel being typed, for errors raised in its helpers


def _kernel_name(state):
    return getattr(_current, "kernel", None) or state.func_id.func_name


def _fn_name(fn):
    return getattr(fn, "__name__", None) or repr(fn)


@register_pass(mutates_CFG=True, analysis_only=False)
class KadjWithBlocks(FunctionPass):
    """Refuse ``with`` blocks (``numba.objmode``, ``parallel_chunksize``...) before numba
    lifts them out of the function; it replaces numba's own with-lifting pass, which
    would compile the rest of the function with kadj's lowering-less pipeline."""

    _name = "kadj_with_blocks"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if isinstance(stmt, ir.EnterWith):
                    _refuse_with(state, stmt)
        return False


def _refuse_with(state, stmt):
    from numba.core.withcontexts import _ObjModeContextType

    cm = None
    try:
        cm = resolve_value(state.func_ir, stmt.contextmanager)
    except (LookupError, AttributeError, KeyError):
        try:  # a called context manager: objmode(r="float64")
            defn = state.func_ir.get_definition(stmt.contextmanager)
            if isinstance(defn, ir.Expr) and defn.op == "call":
                cm = resolve_value(state.func_ir, defn.func)
        except (LookupError, AttributeError, KeyError):
            cm = None
    where = ""
    if state.func_id.func_name != _kernel_name(state):
        where = f" (in the helper '{state.func_id.func_name}')"
    if isinstance(cm, _ObjModeContextType):
        raise DifferentiationError(
            f"object-mode blocks cannot be differentiated{where}: their Python code is "
            "invisible to kadj", kernel=_kernel_name(state), loc=stmt.loc,
            construct="with numba.objmode(...) block",
            remedy="move the object-mode code out of the kernel (before or after the "
                   "call), or register a custom adjoint (@kadj.register_adjoint) for a "
                   "helper function that wraps it")
    name = _fn_name(type(cm)) if cm is not None else "a context manager"
    raise DifferentiationError(
        f"with-blocks are not supported in differentiated kernels{where}",
        kernel=_kernel_name(state), loc=stmt.loc, construct=f"with-block ({name})",
        remedy="remove the with-statement from the kernel and run its body directly")


def _untyped_pipeline(state, name="untyped"):
    """numba's untyped pipeline with :class:`KadjWithBlocks` in place of its
    with-lifting pass, and four passes skipped or cut short where the IR gives them
    nothing to do (:mod:`kadj.lean_passes`: closures inlined only where there are
    some, the variables' lifetimes computed only where a pass reads them, two of the
    bytecode translation's peephole rewrites only where they find something)."""
    from numba.core.untyped_passes import ReconstructSSA, WithLifting

    from .lean_passes import UNTYPED

    numba_pm = DefaultPassBuilder.define_untyped_pipeline(state, name)
    pm = PassManager(name)   # not finalized: the caller adds passes and finalizes
    for cls, desc in numba_pm.passes:
        if cls is ReconstructSSA:
            continue         # (after the callees are inlined: :class:`_FrontendPipeline`)
        if cls is WithLifting:
            cls, desc = KadjWithBlocks, "kadj: refuse with-blocks"
        pm.add_pass(UNTYPED.get(cls, cls), desc)
    return pm


@register_pass(mutates_CFG=True, analysis_only=False)
class KadjInlineCallees(FunctionPass):
    """Inline every call to a jitted Python function that has no derivative rule.

    A worklist of blocks, each tagged with the chain of helpers it was inlined from: a
    helper already on its own chain (or the kernel itself) is real recursion and is
    refused by name; any number of calls to the same helper, and helpers nested
    several levels deep, are inlined."""

    _name = "kadj_inline_callees"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        from numba.core.inline_closurecall import InlineWorker, callee_ir_validator

        worker = InlineWorker(state.typingctx, state.targetctx, state.locals,
                              state.pipeline, state.flags, validator=callee_ir_validator)
        # InlineWorker takes its untyped pipeline only through this attribute (numba
        # sets it in __init__ and reads it in run_untyped_passes); there is no argument
        worker._compiler_pipeline = _untyped_pipeline
        kernel = _kernel_name(state)
        fir = state.func_ir
        root = state.func_id.func
        chains = {label: () for label in fir.blocks}
        work = sorted(fir.blocks, reverse=True)
        callee_irs = {}
        inlined = 0
        while work:
            label = work.pop()
            block = fir.blocks[label]
            for i, instr in enumerate(block.body):
                callee = _inlinable_callee(fir, instr)
                if callee is None:
                    continue
                fn = callee.py_func
                chain = chains[label]
                if inspect.isgeneratorfunction(fn):
                    _refuse_generator(kernel, fn, instr.loc)
                if fn is root or fn in chain:
                    _refuse_recursion(kernel, root, chain, fn, instr.loc)
                if instr.value.vararg or getattr(instr.value, "varkwarg", None):
                    raise DifferentiationError(
                        "calls with star arguments to jitted helpers are not "
                        "supported", kernel=kernel, loc=instr.loc,
                        construct=f"call to {fn.__name__}",
                        remedy="pass the helper's arguments one by one")
                if instr.value.kws:
                    i += _keywords_to_positions(kernel, fir, fn, block, i, instr)
                inlined += 1
                if inlined > _MAX_INLINED_CALLS:
                    raise DifferentiationError(
                        f"inlining its helper functions makes the kernel too large (more "
                        f"than {_MAX_INLINED_CALLS} inlined calls)", kernel=kernel,
                        loc=instr.loc, construct=f"call to {fn.__name__}",
                        remedy=f"register a custom adjoint for '{fn.__name__}' "
                               "(@kadj.register_adjoint) so that it is called, not "
                               "inlined")
                if fn not in callee_irs:
                    callee_irs[fn] = worker.run_untyped_passes(fn)
                *_, new_blocks = worker.inline_ir(fir, block, i, callee_irs[fn],
                                                  fn.__code__.co_freevars)
                tail, *body = [lb for lb, _ in new_blocks]
                chains[tail] = chain
                for lb in body:
                    chains[lb] = chain + (fn,)
                work.extend(reversed([tail] + body))
                break
        if inlined:
            cfg = compute_cfg_from_blocks(fir.blocks)
            for dead in cfg.dead_nodes():
                del fir.blocks[dead]
            postproc.PostProcessor(fir).run()
            fir.blocks = simplify_CFG(fir.blocks)
        return bool(inlined)


def _keywords_to_positions(kernel, fir, fn, block, i, instr):
    """Rewrite the call ``instr`` (statement ``i`` of ``block``) of helper ``fn`` with
    keyword arguments (``h(v, c=a, m=3)``) as a call with positional ones, each keyword
    at its parameter's place, the helper's defaults in the places left between
    (assigned as constants right before the call).  Returns the number of statements
    inserted before the call."""
    expr = instr.value
    params = list(inspect.signature(fn).parameters.values())

    def refuse(why):
        raise DifferentiationError(
            f"the call's keyword arguments {why}", kernel=kernel, loc=instr.loc,
            construct=f"call to {fn.__name__}",
            remedy="pass the helper's arguments positionally")
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        refuse("meet a parameter that is not a plain one (*args, keyword-only)")
    args, kws = list(expr.args), dict(expr.kws)
    names = [p.name for p in params]
    if set(kws) - set(names[len(args):]):
        refuse(f"name no free parameter of '{fn.__name__}' "
               f"({', '.join(sorted(set(kws) - set(names[len(args):])))})")
    last = max(names.index(k) for k in kws)
    new = []
    for p in params[len(args):last + 1]:
        if p.name in kws:
            args.append(kws[p.name])
        elif p.default is not p.empty:
            var = ir.Var(block.scope, ir_utils.mk_unique_var(f"$default_{p.name}"),
                         instr.loc)
            const = ir.Const(p.default, instr.loc)
            new.append(ir.Assign(const, var, instr.loc))
            fir._definitions[var.name] = [const]
            args.append(var)
        else:
            refuse(f"leave out '{p.name}', which has no default")
    expr.args, expr.kws = args, ()
    block.body[i:i] = new
    return len(new)


def _inlinable_callee(func_ir, instr):
    """The jitted function ``instr`` calls when kadj inlines it (no derivative rule),
    else None."""
    if not (isinstance(instr, ir.Assign) and isinstance(instr.value, ir.Expr)
            and instr.value.op == "call"):
        return None
    try:
        callee = resolve_value(func_ir, instr.value.func)
    except (LookupError, AttributeError, KeyError):
        return None
    if not is_jitted(callee) or rules.lookup(callee) is not None:
        return None
    return callee


def _refuse_generator(kernel, fn, loc):
    what = "the kernel is a generator" if fn is None else \
        f"'{_fn_name(fn)}' is a generator function"
    raise DifferentiationError(
        f"{what} (it uses yield); generators cannot be differentiated",
        kernel=kernel, loc=loc, construct="generator (yield)",
        remedy="write the values into an array in a loop, or compute them in the loop "
               "that consumes them")


def _refuse_recursion(kernel, root, chain, fn, loc):
    calls = (root,) + chain + (fn,)
    start = next(k for k, f in enumerate(calls) if f is fn)
    cycle = " -> ".join(_fn_name(f) for f in calls[start:])
    raise DifferentiationError(
        f"the function '{_fn_name(fn)}' is recursive ({cycle}); kadj differentiates "
        "helper functions by inlining them, which recursion cannot be",
        kernel=kernel, loc=loc, construct=f"recursive call to {_fn_name(fn)}",
        remedy=f"rewrite '{_fn_name(fn)}' as a loop, or register a custom adjoint for it "
               "(@kadj.register_adjoint) so that it is called, not inlined")


class _FrontendPipeline(CompilerBase):
    def define_pipelines(self):
        pm = _untyped_pipeline(self.state)
        pm.add_pass(KadjInlineCallees, "kadj: inline jitted callees")
        ssa = self.state.flags.enable_ssa
        if ssa:   # the inlined callees' blocks are versioned and joined too
            pm.add_pass(untyped_passes.ReconstructSSA, "ssa")
        pm.add_pass(typed_passes.NopythonTypeInference, "nopython frontend")
        if ssa:
            pm.add_pass(typed_passes.PreLowerStripPhis, "joins as assignments")
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


def _with_ssa(flags):
    ssa = copy.copy(flags)
    ssa.enable_ssa = True
    return ssa


def _typed(py_func, typingctx, targetctx, arg_types, flags):
    """(the frontend pipeline run on ``py_func`` up to type inference, "" or where
    typing failed without SSA): typed without SSA, and where that fails, with it (the
    first failure raised if both fail)."""
    try:
        return _typed_once(py_func, typingctx, targetctx, arg_types, flags), ""
    except errors.TypingError as first:
        if flags.enable_ssa:
            raise
        try:
            pipeline = _typed_once(py_func, typingctx, targetctx, arg_types,
                                   _with_ssa(flags))
        except errors.TypingError:
            raise first from None
        return pipeline, _typing_failure(first)


def _typing_failure(exc):
    """Where a typing error is, ``file.py:line``, or what it is when it names no line."""
    loc = getattr(exc, "loc", None)
    if loc is not None and getattr(loc, "line", None):
        return f"{os.path.basename(loc.filename)}:{loc.line}"
    return type(exc).__name__


def _typed_once(py_func, typingctx, targetctx, arg_types, flags):
    pipeline = _FrontendPipeline(typingctx, targetctx, None, tuple(arg_types), None,
                                 flags, {})
    pipeline.state.cr = None
    try:
        pipeline.compile_extra(py_func)
    except compiler.CompilerError as exc:  # the lowering-less pipeline ended
        if "pipelines exhausted" not in str(exc):
            raise
    return pipeline


def _run(py_func, typingctx, targetctx, arg_types, target, flags=None, context=None):
    """Run the frontend pipeline; ``context`` is an optional context manager to run it in
    (the CUDA target override), ``flags`` replaces the CPU flags."""
    import contextlib

    if inspect.isgeneratorfunction(py_func):
        code = py_func.__code__
        _refuse_generator(py_func.__name__, None,
                          ir.Loc(code.co_filename, code.co_firstlineno))
    outer, _current.kernel = getattr(_current, "kernel", None), py_func.__name__
    try:
        with (context or contextlib.nullcontext()):
            pipeline, retyped = _typed(py_func, typingctx, targetctx, arg_types,
                                       flags or _flags())
    finally:
        _current.kernel = outer
    st = pipeline.state
    if st.get("typemap") is None:
        raise DifferentiationError("numba could not type the kernel",
                                   kernel=py_func.__name__)
    func_ir = st.func_ir
    return TypedKernel(
        name=py_func.__name__, py_func=py_func, func_ir=func_ir, typemap=dict(st.typemap),
        calltypes=dict(st.calltypes), return_type=st.return_type,
        arg_names=tuple(func_ir.arg_names), arg_types=tuple(arg_types), target=target,
        retyped=retyped)
