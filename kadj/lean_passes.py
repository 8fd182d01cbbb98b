"""Six of numba's passes skipped, or cut short, where the IR shows they have nothing
to do.

numba's nopython pipeline runs ``InlineClosureLikes`` (inline locally defined closures,
``functools.reduce`` and stencil calls, and turn list comprehensions wrapped in
``np.array`` into array loops) and, after typing, ``NopythonRewrites`` (string-literal
``getitem``/``setitem``, arrays of constant lists, and the fusion of array expressions
such as ``a + b * c`` on whole arrays).  Each recomputes the liveness of every variable
in every block, once or twice, whether or not it rewrites anything: a cost that grows
with the product of the function's variables and blocks.  An adjoint's source is long
and written by kadj (element loops, no closures, no comprehensions, no whole-array
arithmetic), so for a 50-step limiter kernel's adjoint the two passes took 2.9 of the
8.5 seconds numba spent compiling it, and rewrote nothing.  ``PreLowerStripPhis``
removes the phi nodes of SSA form and recomputes the liveness too; an adjoint compiled
without SSA reconstruction (:mod:`kadj.ssa_free`) has none, and the legalisation pass
right after it recomputes the liveness anyway.

:class:`LeanInlineClosureLikes` and :class:`LeanNopythonRewrites` first look at the IR
for what the pass could act on (a ``make_function``, a list built or appended to, a
global ``reduce`` or stencil; a string-literal index, a list built, an array-valued
unary or binary operation, a ufunc call returning an array) and run numba's pass when
they find any; otherwise they leave the IR as it is, which is what numba's pass would
have done.  :class:`LeanStripPhis` runs numba's pass where the IR holds a phi node (or
is a generator's); otherwise it only rebuilds the table of definitions, as numba's
pass does.

Two passes before typing end with numba's post-processing, which makes the control-flow
graph canonical and computes every variable's lifetime: ``IRProcessing`` (that is all
it does) and ``GenericRewrites`` (constant indices, powers, raises and prints rewritten
for typing).  The lifetimes are read before the legalisation pass (which computes them
again, right before lowering) only for a generator or a function that names
``literal_unroll`` (:func:`lifetimes_read`; a with-block's lifting computes them
itself).  :class:`LeanIRProcessing` makes the graph canonical alone elsewhere, and
:class:`LeanGenericRewrites` applies the rewrites as numba does without the
post-processing (they change statements, not the graph).  About 2% of an adjoint's
compile.

``TranslateByteCode``'s interpreter ends with peephole rewrites of the IR, two of which
look at every variable of every statement: one removes the variables that hold a
``with`` block's ``__exit__``, the other fuses dictionary literals built in pieces.
:class:`LeanTranslateByteCode` skips each where the IR has nothing for it (no
``$setup_with_exitfn`` variable; no ``build_map``), the IR being numba's, statement for
statement.

:class:`kadj.ssa_free.AdjointCompiler` uses them in its first pipeline; its fallback
(numba's own pipeline) runs numba's passes.  kadj's frontend, which types the kernel
itself (and each helper it inlines), runs the four untyped ones
(``kadj.frontend._untyped_pipeline``): the generated adjoints are the same, character
for character, and the frontend takes about a sixth less time.
"""
from __future__ import annotations

import functools

import numpy as np
from numba.core import interpreter, ir, rewrites, transforms, types
from numba.core.compiler_machinery import register_pass
from numba.core.ir_utils import build_definitions
from numba.core.typed_passes import NopythonRewrites, PreLowerStripPhis
from numba.core.untyped_passes import (GenericRewrites, IRProcessing, InlineClosureLikes,
                                      TranslateByteCode)
from numba.misc.special import literal_unroll

__all__ = ["LeanGenericRewrites", "LeanIRProcessing", "LeanInlineClosureLikes",
           "LeanNopythonRewrites", "LeanStripPhis", "LeanTranslateByteCode", "UNTYPED",
           "closure_work", "lifetimes_read", "rewrite_work"]


def _exprs(func_ir):
    for block in func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, ir.Assign):
                yield stmt, stmt.value


def closure_work(func_ir):
    """Might ``InlineClosureLikes`` change ``func_ir``?"""
    for _stmt, value in _exprs(func_ir):
        if isinstance(value, ir.Expr):
            if value.op in ("make_function", "build_list"):
                return True
            if value.op == "getattr" and value.attr == "append":
                return True
        elif isinstance(value, (ir.Global, ir.FreeVar)):
            v = value.value
            if v is functools.reduce or type(v).__name__ == "StencilFunc" or \
                    getattr(v, "__name__", None) == "reduce":
                return True
    return False


def rewrite_work(func_ir, typemap):
    """Might ``NopythonRewrites`` change ``func_ir`` (typed by ``typemap``)?"""
    for block in func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, (ir.SetItem, ir.StaticSetItem)) and isinstance(
                    typemap.get(getattr(stmt.index, "name", None)), types.StringLiteral):
                return True
    for stmt, value in _exprs(func_ir):
        if not isinstance(value, ir.Expr):
            continue
        if value.op == "build_list":
            return True
        if value.op == "getitem" and isinstance(typemap.get(value.index.name),
                                                 types.StringLiteral):
            return True
        result = typemap.get(stmt.target.name)
        if not isinstance(result, types.Array):
            continue
        if value.op in ("unary", "binop", "inplace_binop"):
            return True
        if value.op == "call":      # a ufunc (or ufunc-like) call giving an array
            callee = typemap.get(value.func.name)
            key = getattr(callee, "typing_key", None)
            if isinstance(callee, types.Function) and (
                    isinstance(key, np.ufunc) or hasattr(key, "nin")):
                return True
    return False


def _only_where(base, name, work):
    """numba's pass ``base``, registered as ``name``, run only where ``work(state)``
    says the IR gives it something to do (else the IR is left as it is)."""
    def run_pass(self, state):
        return base.run_pass(self, state) if work(state) else False
    cls = type(f"Lean{base.__name__}", (base,), {"_name": name, "run_pass": run_pass,
                                                 "__doc__": base.__doc__})
    return register_pass(mutates_CFG=True, analysis_only=False)(cls)


LeanInlineClosureLikes = _only_where(InlineClosureLikes, "kadj_inline_closure_likes",
                                     lambda state: closure_work(state.func_ir))
LeanNopythonRewrites = _only_where(NopythonRewrites, "kadj_nopython_rewrites",
                                   lambda state: rewrite_work(state.func_ir,
                                                              state.typemap))


@register_pass(mutates_CFG=True, analysis_only=False)
class LeanStripPhis(PreLowerStripPhis):
    _name = "kadj_strip_phis"

    def run_pass(self, state):
        func_ir = state.func_ir
        if func_ir.is_generator or any(
                isinstance(value, ir.Expr) and value.op == "phi"
                for _stmt, value in _exprs(func_ir)):
            return super().run_pass(state)
        func_ir._definitions = build_definitions(func_ir.blocks)
        return True


def lifetimes_read(func_ir):
    """Might a pass before the legalisation read the variables' lifetimes
    (``func_ir.variable_lifetime``) that numba's post-processor computes?  Only where
    the function is a generator (its yield points' live variables) or names
    ``literal_unroll`` (numba's unroller reads the live variables); a with-block's
    lifting computes them itself."""
    if func_ir.is_generator:
        return True
    return any(isinstance(value, (ir.Global, ir.FreeVar)) and value.value is literal_unroll
               for _stmt, value in _exprs(func_ir))


@register_pass(mutates_CFG=True, analysis_only=False)
class LeanIRProcessing(IRProcessing):
    """numba's post-processing of the bytecode's IR: the control-flow graph made
    canonical (one back edge per loop), and every variable's lifetime computed, which
    only :func:`lifetimes_read`'s functions read before the legalisation pass (right
    before lowering) computes them again; elsewhere the graph alone."""
    _name = "kadj_ir_processing"

    def run_pass(self, state):
        func_ir = state.func_ir
        if lifetimes_read(func_ir):
            return super().run_pass(state)
        func_ir.blocks = transforms.canonicalize_cfg(func_ir.blocks)
        return True


@register_pass(mutates_CFG=True, analysis_only=False)
class LeanGenericRewrites(GenericRewrites):
    """numba's rewrites before typing (constant indices as ``static_getitem``, static
    binary operations, constant raises, prints), applied as numba's registry applies
    them, without the post-processing numba runs after them (the graph made canonical
    again, and the lifetimes computed: see :class:`LeanIRProcessing`; these rewrites
    change statements, never the graph) unless :func:`lifetimes_read`."""
    _name = "kadj_generic_rewrites"

    def run_pass(self, state):
        func_ir = state.func_ir
        if lifetimes_read(func_ir):
            return super().run_pass(state)
        blocks = func_ir.blocks
        old_blocks = blocks.copy()
        for rewrite_cls in rewrites.rewrite_registry.rewrites["before-inference"]:
            rewrite = rewrite_cls(state)     # each applied until it stops matching
            work_list = list(blocks.items())
            while work_list:
                key, block = work_list.pop()
                if rewrite.match(func_ir, block, state.typemap, state.calltypes):
                    blocks[key] = rewrite.apply()
                    work_list.append((key, blocks[key]))
        for key, block in blocks.items():
            if block != old_blocks[key]:
                block.verify()
        return True


class _LeanInterpreter(interpreter.Interpreter):
    """numba's bytecode interpreter, whose peephole rewrites of the IR skip the two
    that find nothing to rewrite: the ``__exit__`` of a ``with`` block removed (where
    no variable holds one) and dictionary literals fused (where no dictionary is
    built).  Each looks at every variable of every statement (the first twice)."""

    def post_process(self, peepholes, func_ir):
        skip = set()
        if not _names_with_exit(func_ir):
            skip.add(interpreter.peep_hole_delete_with_exit)
        if not any(isinstance(value, ir.Expr) and value.op == "build_map"
                   for _stmt, value in _exprs(func_ir)):
            skip.add(interpreter.peep_hole_fuse_dict_add_updates)
        return super().post_process([p for p in peepholes if p not in skip], func_ir)


def _names_with_exit(func_ir):
    """Does a variable of the function hold a ``with`` block's ``__exit__`` (numba's
    ``$setup_with_exitfn`` temporaries)?"""
    scopes = {id(block.scope): block.scope for block in func_ir.blocks.values()}
    while scopes:
        _key, scope = scopes.popitem()
        if any(name.startswith("$setup_with_exitfn") for name in scope.localvars._con):
            return True
        if scope.parent is not None:
            scopes[id(scope.parent)] = scope.parent
    return False


@register_pass(mutates_CFG=True, analysis_only=False)
class LeanTranslateByteCode(TranslateByteCode):
    """numba's bytecode-to-IR translation by :class:`_LeanInterpreter`."""
    _name = "kadj_translate_bytecode"

    def run_pass(self, state):
        state["func_ir"] = _LeanInterpreter(state["func_id"]).interpret(state["bc"])
        return True


# numba's untyped passes and the lean pass that takes each one's place (the adjoint
# pipeline and kadj's frontend both use this table)
UNTYPED = {TranslateByteCode: LeanTranslateByteCode, IRProcessing: LeanIRProcessing,
           InlineClosureLikes: LeanInlineClosureLikes, GenericRewrites: LeanGenericRewrites}
