"""Declaration nodes lowered by the target, and the host (CPU) target's lowerings.

The reverse pass is target-neutral: what only a target knows how to spell it leaves as
declaration nodes of the adjoint IR (:data:`adj_ir.DECLARATIONS`): the tapes
(:class:`adj_ir.TapeDecl`, growable or bounded), the scratch arrays it declares
(:class:`adj_ir.LocalArray`, :class:`adj_ir.ZeroArray`), the local sums of its
accumulation lowering (:class:`adj_ir.LocalSums`) and the scalar arguments' adjoints
added into their buffers (:class:`adj_ir.FinishScalar`).  :func:`lower_declarations`
replaces each by the plain nodes of the target's table ``{node class name: (writer,
node) -> [nodes]}``, before the readability passes and the printer see the IR: first
the scalar finishing, then the declarations in prologue order (the order in which
their fresh names are handed out).

The host's table (:data:`HOST`): a growable heap tape (``np.empty((1024,), np.float64)``,
grown by the reservations of :mod:`kadj.tape_plan`), ``np.empty`` scratch arrays and a
plain ``adj_x_buf[0] += adj_x`` per scalar argument.

A :class:`Context` is what a target hands the (one, target-neutral) writer for one
build: its policies as data, its lowerings as functions, and the state those
lowerings read and fill (the CUDA target's thread indexing and memory spaces,
:mod:`kadj.cuda.context`).  :data:`HOST_CONTEXT` is the CPU's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from . import adj_ir as A
from .errors import DifferentiationError
from .printer import Syntax

TAPE_DTYPES = {"f64": "float64", "f32": "float32", "i64": "int64"}
GROWABLE_START = 1024     # entries of a growable tape before its first reservation


def lower_declarations(fn, w, table):
    """Replace the declaration nodes of ``fn`` by their lowering (``table``)."""
    _lower(fn, w, table, lambda x: isinstance(x, A.FinishScalar))
    _lower(fn, w, table, lambda x: isinstance(x, A.DECLARATIONS))
    return fn


def _lower(fn, w, table, chosen):
    def visit(seq):
        out = []
        for x in seq:
            if chosen(x):
                lower = table.get(type(x).__name__)
                if lower is None:
                    raise AssertionError(
                        f"the target has no lowering of {type(x).__name__}")
                out += lower(w, x)
            else:
                for body in x.children():
                    body[:] = visit(body)
                out.append(x)
        return out
    fn.prologue[:] = visit(fn.prologue)
    fn.body[:] = visit(fn.body)


# ---- the host's lowerings ---------------------------------------------------------------
def finish_scalar(w, node):
    """``adj_x_buf[0] += adj_x``: one thread, one plain addition per scalar."""
    return [A.Accumulate(A.AdjElem(name, (), w.adj_buf(name), ("0",)), "+=",
                         w.cast(w.adj(name), w.T[name]), "plain") for name in node.names]


def heap_tape(w, node):
    """A growable tape: a heap array, grown where reservations find it short.  Its shape
    is a 1-tuple, as in every other tape allocation of the host's adjoints: numba then
    compiles one ``np.empty`` per tape type in a process, not one per spelling."""
    assert node.policy == "growable", node
    return [A.Assign(f"_tape_{node.kind}",
                     f"np.empty(({node.size},), np.{TAPE_DTYPES[node.kind]})"),
            A.Assign(f"_sp_{node.kind}", "0")]


def heap_array(w, node):
    return [A.Assign(node.name, f"np.empty({node.size!r}, np.{node.dtype})")]


def no_local_sums(w, node):
    return []


HOST = {"FinishScalar": finish_scalar, "TapeDecl": heap_tape, "LocalArray": heap_array,
        "LocalSums": no_local_sums}


def refuse_barriers(w, node):
    """A CPU kernel has no block of threads to meet."""
    if isinstance(node, A.Barrier):
        raise DifferentiationError("barriers exist only in GPU kernels", kernel=w.k.name,
                                   loc=node.loc, construct="barrier")
    return node


# ---- what a target hands the writer ---------------------------------------------------
@dataclass(frozen=True)
class Context:
    """A target's part in building one adjoint (:class:`kadj.reverse.Writer`).

    syntax:         the printer's spelling of barriers and atomic adds.
    lowerings:      ``(writer, node) -> node | None`` applied to each node as it is
                    placed (``Writer.put``): accumulation policy, barriers, ...
    declarations:   {declaration node class name: ``(writer, node) -> [nodes]``}
                    (:func:`lower_declarations`).
    intrinsics:     the target's :class:`kadj.targets.base.Intrinsics`, or None.
    expressions:    ``(writer, expr) -> text | None``, consulted first for each primal
                    expression the sweeps write (the gather form's coordinates).
    checks:         ``(writer) -> None``: refusals of a kernel the target cannot
                    differentiate (raise :class:`kadj.DifferentiationError`).
    own_element:    ``(writer, array) -> [(kind, value)]``: the running thread's own
                    element of a shared array a checkpointed loop saves (analysis
                    ``checkpoint_owned``; never asked on a CPU).
    growable_tape, merge_repeated_loads, declares_allocations, kernel_returns,
    entry_state_live, space: the writer's policies (:mod:`kadj.forward_sweep`,
                    :mod:`kadj.reverse_sweep`, :mod:`kadj.memory_liveness`).
    join_names:     may the readability passes compute branch values and loop counters
                    under the kernel's names and remember conditions across ``if``
                    blocks (``simplify(..., joins=)``)?  False where a later pass reads
                    numba's shape of guard chains and their names
                    (:mod:`kadj.cuda.guard_hoist`).
    namespace:      objects the adjoint's source names besides ``math`` and ``np``.
    state:          the target's per-build state its functions read and fill.
    """

    syntax: Syntax = Syntax()
    lowerings: tuple = (refuse_barriers,)
    declarations: Mapping = field(default_factory=lambda: dict(HOST))
    intrinsics: object = None
    expressions: tuple = ()
    checks: tuple = ()
    own_element: Callable = None
    growable_tape: bool = True
    merge_repeated_loads: bool = False
    declares_allocations: bool = False
    kernel_returns: bool = True
    entry_state_live: bool = False
    join_names: bool = True
    space: Mapping = field(default_factory=lambda: MappingProxyType({}))
    namespace: Mapping = field(default_factory=lambda: MappingProxyType({}))
    state: object = None


#: the writer's policies a context sets (attributes of the writer)
POLICIES = ("syntax", "lowerings", "intrinsics", "growable_tape", "merge_repeated_loads",
            "declares_allocations", "kernel_returns", "entry_state_live", "space")

HOST_CONTEXT = Context()
