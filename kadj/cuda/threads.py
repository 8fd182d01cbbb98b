"""Which parts of a thread's identity a kernel reads, and what its values depend on.

A thread is identified by its *components* ``("t", d)`` (``threadIdx`` along dimension
``d``, 0 = x) and ``("b", d)`` (``blockIdx`` along ``d``).  A kernel reads a component
through ``cuda.threadIdx.<c>``/``cuda.blockIdx.<c>`` or ``cuda.grid(n)`` (which reads
both, for ``d < n``).  Two threads that differ only in a component the kernel never
reads run the same program on the same data: a launch whose grid or block extends
along such a dimension duplicates threads, and every proof that threads touch
distinct elements (kadj.cuda.indexing) fails.  :func:`check_launch_dims` refuses those
launches for the adjoint.

:class:`ThreadDeps` tells which components each variable's value may depend on (data
flow, plus the branches and loops around variables assigned more than once).
"""
from __future__ import annotations

from .. import ir
from ..errors import DifferentiationError
from .intrinsics import CudaIntrinsic

XYZ = "xyz"
EVERY = frozenset((k, d) for k in "tb" for d in range(3))


def _path(e):
    if isinstance(e, ir.Op) and isinstance(e.fn, CudaIntrinsic):
        return e.fn.path
    return None


def _grid_n(e):
    path = _path(e)
    if path == "grid" and e.args and isinstance(e.args[0], ir.Const):
        return int(e.args[0].value)
    return None


def intrinsic_components(e):
    """Components an intrinsic call ``e`` reads (None: ``e`` is no intrinsic)."""
    path = _path(e)
    if path is None:
        return None
    head, _, c = path.partition(".")
    if head == "threadIdx":
        return frozenset({("t", XYZ.index(c))})
    if head == "blockIdx":
        return frozenset({("b", XYZ.index(c))})
    if path == "grid":
        n = _grid_n(e)
        if n is None:
            return EVERY
        return frozenset((k, d) for k in "tb" for d in range(n))
    if path == "laneid":
        return frozenset(("t", d) for d in range(3))
    if head in ("blockDim", "gridDim") or path in ("gridsize", "warpsize"):
        return frozenset()
    return EVERY  # another intrinsic: may depend on anything


def thread_dims(kernel):
    """(block dimensions, grid dimensions) the kernel reads: the ``d`` of the
    components ``("t", d)`` and ``("b", d)`` it reads, as sorted tuples."""
    comps = set()
    for s in ir.walk(kernel.body):
        path = _path(s.expr) if isinstance(s, ir.Assign) else None
        if path is not None and (path == "grid" or
                                 path.split(".")[0] in ("threadIdx", "blockIdx")):
            comps |= intrinsic_components(s.expr)
    block = tuple(sorted(d for k, d in comps if k == "t"))
    grid = tuple(sorted(d for k, d in comps if k == "b"))
    return block, grid


def _extent(d):
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def describe_dims(block, grid):
    """How a kernel reading these dimensions should be launched, in words."""
    if not block and not grid:
        return "the kernel reads no thread or block index (every thread does the same)"
    parts = []
    if block:
        parts.append("threadIdx." + "/".join(XYZ[d] for d in block))
    if grid:
        parts.append("blockIdx." + "/".join(XYZ[d] for d in grid))
    return "the kernel reads only " + " and ".join(parts)


def check_launch_dims(kernel_name, call, config, block, grid):
    """Refuse a launch of ``call`` (``"k.adjoint"``) with ``config`` whose block has
    more than one thread along a dimension whose ``threadIdx`` the kernel never reads,
    or whose grid has more than one block along a dimension whose ``blockIdx`` it never
    reads: those threads would duplicate others, and the adjoint (plain accumulations
    into a thread's own elements, stored elements' adjoints consumed once) would count
    their contributions several times or race."""
    gdim, bdim = _extent(config[0]), _extent(config[1])
    extra = [f"{bdim[d]} threads per block along {XYZ[d]}" for d in range(3)
             if bdim[d] > 1 and d not in block]
    extra += [f"{gdim[d]} blocks along {XYZ[d]}" for d in range(3)
              if gdim[d] > 1 and d not in grid]
    if not extra:
        return
    shown = f"{call}[{config[0]!r}, {config[1]!r}]"
    n = max(list(block) + list(grid) + [-1]) + 1
    if n:
        example = "[(n,), (256,)] for cuda.grid(1)" if n == 1 else \
            "[(nx, ny), (16, 16)] for cuda.grid(2)" if n == 2 else \
            "[(nx, ny, nz), (8, 8, 4)] for cuda.grid(3)"
        remedy = ("launch with grid and block dimensions matching the kernel's "
                  f"coordinates, e.g. {example}")
    else:
        remedy = ("launch it with one thread ([1, 1]), or give each thread its own "
                  "work through cuda.grid / cuda.threadIdx")
    raise DifferentiationError(
        f"the launch {shown} has {' and '.join(extra)}, but {describe_dims(block, grid)}"
        ": threads that differ only along that dimension run the same computation, "
        "and the adjoint would count their contributions several times (or race)",
        kernel=kernel_name, construct="launch with more dimensions than the kernel's "
        "thread coordinates", remedy=remedy)


def _exits(s):
    """Does a branch of ``if`` statement ``s`` leave the loop or the kernel?"""
    return any(isinstance(x, (ir.Break, ir.Return)) for x in ir.walk(s.then + s.orelse))


class ThreadDeps:
    """Components each variable of ``kernel`` may depend on (:attr:`deps`)."""

    def __init__(self, kernel):
        self.k = kernel
        # var -> [(expr, conditions of the ifs around it, exit conditions of the loops
        # around it)]; a loop index's expr holds the range's bounds
        self.sources = {}
        self.in_loop = set()    # variables assigned inside a loop (loop indices too)

        def visit(seq, conds, exits):
            for s in seq:
                if isinstance(s, ir.Assign):
                    self.sources.setdefault(s.target, []).append((s.expr, conds, exits))
                elif isinstance(s, ir.If):
                    visit(s.then, conds + (s.cond,), exits)
                    visit(s.orelse, conds + (s.cond,), exits)
                elif isinstance(s, (ir.ForRange, ir.Loop)):
                    # the value a variable assigned in the body ends with depends on
                    # how often the body ran: on the conditions of its exits
                    inner = exits + tuple(x.cond for x in ir.walk(s.body)
                                          if isinstance(x, ir.If) and _exits(x))
                    if isinstance(s, ir.ForRange):  # the range's values, until exits
                        self.sources.setdefault(s.index, []).append(
                            (ir.Op(None, (s.start, s.stop, s.step)), conds, inner))
                    self.in_loop |= ir.assigned(s.body) | (
                        {s.index} if isinstance(s, ir.ForRange) else set())
                    visit(s.body, conds, inner)

        visit(kernel.body, (), ())
        self.grid_tuple = {v: _grid_n(es[0][0]) for v, es in self.sources.items()
                           if len(es) == 1 and _grid_n(es[0][0]) is not None}
        self.stored = {}        # array -> operands of its stores (values and indices)
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.Store):
                self.stored.setdefault(s.array.name, []).extend(
                    (s.value,) + tuple(s.index))
        self.deps = {}
        changed = True
        while changed:
            changed = False
            for v, entries in self.sources.items():
                d = set(self.deps.get(v, ()))
                for e, conds, exits in entries:
                    d |= self._expr_deps(e) | self._operand_deps(exits)
                    if len(entries) > 1:  # which assignment ran last: the branches'
                        d |= self._operand_deps(conds)
                if v not in self.deps or len(d) != len(self.deps[v]):
                    self.deps[v] = frozenset(d)
                    changed = True

    def _operand_deps(self, xs):
        out = set()
        for x in xs:
            if isinstance(x, ir.Var):
                out |= self.deps.get(x.name, frozenset())
        return out

    def _expr_deps(self, e):
        comps = intrinsic_components(e)
        if comps is not None:
            return set(comps)
        if isinstance(e, ir.Item) and e.value.name in self.grid_tuple:
            n = self.grid_tuple[e.value.name]
            return {("t", e.index), ("b", e.index)} if e.index < n else set()
        out = self._operand_deps(ir.operands(e))
        if isinstance(e, ir.Load):
            # a loaded value depends on what the kernel stores into the array
            out |= self._operand_deps(self.stored.get(e.array.name, ()))
        return out

    def of(self, x):
        """Components operand ``x`` may depend on."""
        return frozenset(self._operand_deps((x,)))

    def invariant(self, x):
        """Is ``x`` the same value in every thread, all the time (a constant, or a
        variable assigned once, outside loops, from thread-independent values)?"""
        if isinstance(x, ir.Const):
            return True
        if not isinstance(x, ir.Var):
            return False
        entries = self.sources.get(x.name)
        return entries is not None and len(entries) == 1 and \
            x.name not in self.in_loop and not self.deps.get(x.name)
