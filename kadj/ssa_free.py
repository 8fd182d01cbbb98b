"""numba's compilation of a serial CPU adjoint, without SSA reconstruction when that
cannot change what it computes.

numba rebuilds SSA form before typing (``ReconstructSSA``): every variable assigned in
several places becomes one variable per assignment, and the function is rewritten twice
per such variable.  An adjoint assigns many variables more than once (adjoint
accumulators, tape pointers, the kernel's own overwritten values), so this costs about a
fifth of compiling a long adjoint.  Without SSA, numba gives each variable one type, the
unification of the types of all its assignments; with SSA each assignment keeps its
own, and a variable that holds an integer here and a float there computes differently.

:class:`AdjointCompiler` (numba's ``pipeline_class``) first compiles without SSA and,
right after type inference, checks that every variable assigned more than once has
exactly the type of each value assigned to it (literal types compared as their
non-literal types; :func:`mixed_assignment`).  Then each SSA version would have had that
same type, by induction over the definitions, and the function computes the same thing
either way.  Otherwise (a variable that changes type, a value whose type the check
cannot see), or when the SSA-free typing fails, numba's own pipeline with SSA compiles
it, from the bytecode again.  Parallel adjoints (``parallel=True``) always take numba's
own pipeline.  The first pipeline also skips numba's passes that have nothing to do in
an adjoint (:mod:`kadj.lean_passes`); both optimise the LLVM module once
(:mod:`kadj.lean_library`).
"""
from __future__ import annotations

import os
from collections import defaultdict

from numba.core import errors, ir, types
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NativeLowering, NopythonRewrites, NopythonTypeInference, \
    PreLowerStripPhis
from numba.core.untyped_passes import FixupArgs

from .lean_lowering import LeanNativeLowering
from .lean_library import LeanCodeLibrary, LeanLibrary
from .lean_passes import UNTYPED, LeanNopythonRewrites, LeanStripPhis

_LEAN = {**UNTYPED, NopythonRewrites: LeanNopythonRewrites, PreLowerStripPhis: LeanStripPhis,
         NativeLowering: LeanNativeLowering}

__all__ = ["AdjointCompiler", "WithSSA", "mixed_assignment", "options_for"]


class NeedsSSA(errors.NumbaError):
    """The SSA-free typing gave a variable a type one of its assignments lacks."""


def _rhs_type(value, state):
    """The type of an assigned value as its own assignment would type it, or None where
    the typed IR does not say."""
    if isinstance(value, ir.Var):
        return state.typemap.get(value.name)
    if isinstance(value, ir.Const):
        return state.typingctx.resolve_value_type(value.value)
    if isinstance(value, ir.Arg):
        return state.args[value.index]
    if isinstance(value, ir.Expr):
        sig = state.calltypes.get(value)
        if sig is not None:
            return sig.return_type
        return _untyped_expr_type(value, state)
    return None


def _untyped_expr_type(expr, state):
    """The type of an expression that numba types without a call signature (a tuple's
    constant element, an attribute, a cast), or None."""
    try:        # (numba's ir.Expr raises KeyError for an argument it does not have)
        operand = expr.value
    except (AttributeError, KeyError):
        return None
    ty = state.typemap.get(operand.name) if isinstance(operand, ir.Var) else None
    if ty is None:
        return None
    if expr.op == "static_getitem" and isinstance(ty, types.BaseTuple) \
            and isinstance(expr.index, int) and -len(ty) <= expr.index < len(ty):
        return ty[expr.index]
    if expr.op == "getattr":
        return state.typingctx.resolve_getattr(ty, expr.attr)
    if expr.op == "cast":
        return ty
    return None


def mixed_assignment(state):
    """``(variable, value)`` of the first assignment whose value's type differs from
    the variable's single SSA-free type (or is unknown, for a variable assigned more
    than once); None when there is none.  A variable assigned once counts too: numba
    unifies the types of a copy's two sides without SSA, so ``c = x[i]`` (float32),
    copied into a float64 variable, became float64 itself, and every float32 product of
    ``c`` a float64 one.

    numba's own join temporaries (``$phi<block>.<slot>``: a value left on Python's
    stack at the end of each predecessor of a block, such as the two arms of ``a if c
    else b``) are exempt: each is assigned at the end of the predecessors of one block
    and read only on entering that block, so every read is reached by all of its
    assignments and SSA would merge them in a phi of the unified type, the single type
    they get without SSA.  The arms' values are converted to it at the assignment
    instead of at the join: the same conversion of the same value."""
    values = defaultdict(list)
    for block in state.func_ir.blocks.values():
        for stmt in block.find_insts(ir.Assign):
            values[stmt.target.name].append(stmt.value)
    for name, defs in values.items():
        if name.startswith("$phi"):
            continue
        want = types.unliteral(state.typemap[name])
        for value in defs:
            got = _rhs_type(value, state)
            if got is None and len(defs) < 2:
                continue    # (one assignment whose value the typed IR does not type)
            if got is None or types.unliteral(got) != want:
                return name, value
    return None


@register_pass(mutates_CFG=False, analysis_only=False)
class _SSAOff(FunctionPass):
    _name = "kadj_ssa_off"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        state.flags.enable_ssa = False
        return False


@register_pass(mutates_CFG=False, analysis_only=False)
class _SSAOn(FunctionPass):
    """Start of the fallback: SSA on, and the typing of the SSA-free attempt dropped."""
    _name = "kadj_ssa_on"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        state.flags.enable_ssa = True
        state.return_type = state.get("kadj_declared_return")
        state.typemap = state.calltypes = None
        state.status.fail_reason = None   # numba would report it as a typing error
        if isinstance(state.library, LeanCodeLibrary):   # numba's own, from scratch
            state.library = None
        return False


@register_pass(mutates_CFG=False, analysis_only=True)
class _OneTypeEach(FunctionPass):
    _name = "kadj_one_type_each"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        found = mixed_assignment(state)
        if found is not None:
            name, value = found
            raise NeedsSSA(f"{name} = {value} changes the type of {name}")
        return False


class AdjointCompiler(CompilerBase):
    """numba's nopython pipeline, first without SSA reconstruction (checked after
    typing), then, if that is refused or fails to type, with it; both lower with less
    LLVM IR (:mod:`kadj.lean_lowering`) and optimise the LLVM module once
    (:mod:`kadj.lean_library`)."""

    def define_pipelines(self):
        st = self.state
        if st.flags.force_pyobject or st.flags.auto_parallel.enabled \
                or not st.flags.enable_ssa:
            return [DefaultPassBuilder.define_nopython_pipeline(st)]
        st["kadj_declared_return"] = st.return_type
        st.flags.enable_ssa = False
        try:
            fast = DefaultPassBuilder.define_nopython_pipeline(st, "kadj_ssa_free")
        finally:
            st.flags.enable_ssa = True
        fast.add_pass_after(_SSAOff, FixupArgs)
        fast.add_pass_after(_OneTypeEach, NopythonTypeInference)
        # LLVM's optimisation once over the whole module (kadj.lean_library)
        fast.add_pass_after(LeanLibrary, _OneTypeEach)
        # five passes that recompute every variable's liveness, run only where the
        # IR gives them something to do or where it is read (kadj.lean_passes);
        # lowering with less LLVM IR (kadj.lean_lowering)
        fast.passes[:] = [(_LEAN.get(cls, cls), desc) for cls, desc in fast.passes]
        fast.finalize()
        full = _with_ssa(st)
        full.add_pass_after(_SSAOn, FixupArgs)
        full.finalize()
        return [fast, full]


def _with_ssa(state):
    pm = DefaultPassBuilder.define_nopython_pipeline(state)
    pm.add_pass_after(LeanLibrary, NopythonTypeInference)
    pm.passes[:] = [(LeanNativeLowering if cls is NativeLowering else cls, desc)
                    for cls, desc in pm.passes]
    return pm


class WithSSA(CompilerBase):
    """:class:`AdjointCompiler`'s fallback alone: numba's nopython pipeline (SSA
    reconstruction, all of numba's passes) with the adjoints' lowering
    (:mod:`kadj.lean_lowering`) and LLVM optimisation (:mod:`kadj.lean_library`)."""

    def define_pipelines(self):
        pm = _with_ssa(self.state)
        pm.finalize()
        return [pm]


def options_for(options):
    """numba jit options of a CPU adjoint: ``options`` with :class:`AdjointCompiler`
    unless the adjoint is parallel (or ``KADJ_SSA_FREE=0`` is set)."""
    if options.get("parallel") or "pipeline_class" in options \
            or os.environ.get("KADJ_SSA_FREE", "1") == "0":
        return dict(options)
    return dict(options, pipeline_class=AdjointCompiler)
