"""Which threads touch which array elements: the accumulation class of each array.

The adjoint of a load ``x[idx]`` adds into ``adj_x[idx]``.  Whether two threads can add
into the same element decides between a plain ``+=`` and an atomic, so every array gets
a class from its index expressions (DESIGN.md, "Performance principles"):

``private``
    every load and store of the array uses one and the same *thread index*: a tuple of
    distinct global thread coordinates covering every dimension of the launch.  A
    coordinate is ``cuda.grid(n)``'s component, ``threadIdx.d + blockIdx.d * blockDim.d``
    (either order), or the variable of a grid-stride loop
    ``for i in range(<coordinate d>, n, <cuda.gridsize component d>)``; each such variable
    is assigned exactly once.  No two threads share an element: plain ``+=``.
``uniform``
    the index does not depend on the thread (coefficients, ``w[k]`` in a loop): atomic
    (reported so that a regression suite sees it).
``neighbour``
    coordinates plus or minus constants (stencils): atomic.
``arbitrary``
    anything else (index arrays, computed cells): atomic.

When the proof fails for any access, the array is not private: unsure means atomic.
The launch is taken to extend only along the dimensions whose ``threadIdx`` /
``blockIdx`` the kernel reads (``cuda.grid(2)`` -> 2-D): the adjoint's launch refuses
any other (:func:`kadj.cuda.threads.check_launch_dims`).  A kernel that reads an index
dimension its coordinates do not cover (``cuda.grid(1)`` and ``threadIdx.y``) has no
private global array.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

from .. import ir
from .intrinsics import CudaIntrinsic
from .threads import thread_dims


@dataclass(frozen=True)
class ArrayClass:
    name: str
    cls: str            # private | uniform | neighbour | arbitrary
    why: str


def _op(e, fn):
    return isinstance(e, ir.Op) and e.fn is fn and len(e.args) == 2


def _intrinsic(e):
    if isinstance(e, ir.Op) and isinstance(e.fn, CudaIntrinsic):
        return e.fn.path
    return None


class ThreadIndex:
    """Global thread coordinates and thread-(in)dependence of a kernel's variables."""

    @classmethod
    def of(cls, kernel):
        """The index analysis of ``kernel``, counting its assignments."""
        count = {}
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.Assign):
                count[s.target] = count.get(s.target, 0) + 1
        return cls(kernel, count)

    def __init__(self, kernel, assign_count):
        self.k = kernel
        self.once = {v for v, c in assign_count.items() if c == 1}
        self.defs = {}
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.Assign) and s.target in self.once:
                self.defs[s.target] = s.expr
        # a copy of a variable assigned once, made in several places (the statements
        # after an early return, duplicated on each path: an inlined helper's index
        # parameter) holds that one value wherever it is defined
        copies = {}
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.Assign) and s.target not in self.once:
                src = s.expr.src if isinstance(s.expr, ir.Copy) else None
                copies.setdefault(s.target, set()).add(
                    src.name if isinstance(src, ir.Var) and src.name in self.once
                    else None)
        for v, srcs in copies.items():
            if len(srcs) == 1 and None not in srcs:
                self.once.add(v)
                self.defs[v] = ir.Copy(ir.Var(next(iter(srcs))))
        self.loops = {}
        loop_count = {}
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.ForRange):
                loop_count[s.index] = loop_count.get(s.index, 0) + 1
                self.loops[s.index] = s
        # counters of loops that bind them once and nothing else assigns
        self.counters = {v for v, c in loop_count.items()
                         if c == 1 and not assign_count.get(v, 0)}
        self.coord = {}       # var -> dimension
        self.size = {}        # var -> dimension (total threads along it)
        self.ndim = 0
        self._find(loop_count, assign_count)
        # copies: the variable each coordinate copies, and integer constants
        self.root = {}
        self.consts = {}
        for _ in range(4):
            for v, e in self.defs.items():
                if isinstance(e, ir.Copy) and isinstance(e.src, ir.Const) and \
                        isinstance(e.src.value, int) and not isinstance(e.src.value, bool):
                    self.consts[v] = e.src.value
                elif isinstance(e, ir.Copy) and isinstance(e.src, ir.Var):
                    if e.src.name in self.consts:
                        self.consts[v] = self.consts[e.src.name]
                    if v in self.coord:
                        self.root[v] = self.root.get(e.src.name, e.src.name)
        self.varying = self._varying()
        # block-local coordinates (threadIdx.d), for shared arrays
        self.local = {}
        for v in self.defs:
            reg = self._reg(ir.Var(v))
            if reg is not None and reg.startswith("threadIdx."):
                self.local[v] = "xyz".index(reg[-1])
        self.block_ndim = max([self.ndim] + [d + 1 for d in self.local.values()])
        # the thread and block index dimensions the kernel reads; when it reads one
        # beyond its global coordinates (cuda.grid(1) and threadIdx.y), the coordinates
        # do not tell its threads apart: no global array is then private
        self.block_dims, self.grid_dims = thread_dims(kernel)
        self.coords_cover = all(d < self.ndim for d in self.block_dims + self.grid_dims)

    # ---- coordinates ---------------------------------------------------------------
    def _reg(self, x):
        if isinstance(x, ir.Var):
            e = self.defs.get(x.name)
            while isinstance(e, ir.Copy) and isinstance(e.src, ir.Var):
                e = self.defs.get(e.src.name)
            return _intrinsic(e) if e is not None else None
        return None

    def _find(self, loop_count, assign_count):
        tuples = {}  # var -> ("grid"|"gridsize", n)
        changed = True
        while changed:
            changed = False
            for v, e in self.defs.items():
                if v in self.coord or v in self.size or v in tuples:
                    continue
                dim = None
                path = _intrinsic(e)
                if path in ("grid", "gridsize") and e.args and \
                        isinstance(e.args[0], ir.Const):
                    n = int(e.args[0].value)
                    self.ndim = max(self.ndim, n)
                    if n == 1:
                        (self.coord if path == "grid" else self.size)[v] = 0
                    else:
                        tuples[v] = (path, n)
                    changed = True
                    continue
                if isinstance(e, ir.Copy) and isinstance(e.src, ir.Var):
                    src = e.src.name
                    for table in (self.coord, self.size, tuples):
                        if src in table:
                            table[v] = table[src]
                            changed = True
                    continue
                if isinstance(e, ir.Item) and e.value.name in tuples:
                    path, n = tuples[e.value.name]
                    if e.index < n:
                        (self.coord if path == "grid" else self.size)[v] = e.index
                        changed = True
                    continue
                if _op(e, operator.add):
                    dim = self._manual_coord(*e.args)
                    if dim is not None:
                        self.coord[v] = dim
                        self.ndim = max(self.ndim, dim + 1)
                        changed = True
                    continue
                if _op(e, operator.mul):
                    regs = {self._reg(x) for x in e.args}
                    for d, c in enumerate("xyz"):
                        if regs == {f"blockDim.{c}", f"gridDim.{c}"}:
                            self.size[v] = d
                            changed = True
        # grid-stride loops: for i in range(<coordinate d>, n, <size d>)
        for idx, loop in self.loops.items():
            if loop_count.get(idx) != 1 or assign_count.get(idx, 0):
                continue
            if isinstance(loop.start, ir.Var) and isinstance(loop.step, ir.Var):
                d = self.coord.get(loop.start.name)
                if d is not None and self.size.get(loop.step.name) == d:
                    self.coord[idx] = d
                    self._loop_copies(idx, loop)

    def _loop_copies(self, idx, loop):
        """Copies of a grid-stride loop's variable (numba's ``$phi = i`` around a
        branch: ``y[i] += a if c else b``) are that coordinate when every read of the
        copy follows it in its own statement sequence: the copy was made in the same
        iteration of the loop (the variable is the same throughout an iteration)."""
        names = {idx}

        def visit(seq):
            for pos, s in enumerate(seq):
                if isinstance(s, ir.Assign) and s.target in self.once and \
                        isinstance(s.expr, ir.Copy) and isinstance(s.expr.src, ir.Var) \
                        and s.expr.src.name in names:
                    later = {id(x) for x in ir.walk(seq[pos + 1:])}
                    if all(id(x) in later for x in ir.walk(self.k.body)
                           if s.target in ir.stmt_reads(x)):
                        self.coord[s.target] = self.coord[idx]
                        names.add(s.target)
                elif isinstance(s, ir.If):
                    visit(s.then)
                    visit(s.orelse)
                elif isinstance(s, (ir.ForRange, ir.Loop)):
                    visit(s.body)

        visit(loop.body)

    def _manual_coord(self, a, b):
        """threadIdx.d + blockIdx.d * blockDim.d (any order) -> d."""
        for t, p in ((a, b), (b, a)):
            reg = self._reg(t)
            if reg is None or not reg.startswith("threadIdx."):
                continue
            c = reg[-1]
            if not isinstance(p, ir.Var):
                continue
            pe = self.defs.get(p.name)
            if _op(pe, operator.mul) and {self._reg(x) for x in pe.args} == {
                    f"blockIdx.{c}", f"blockDim.{c}"}:
                return "xyz".index(c)
        return None

    # ---- thread dependence ---------------------------------------------------------
    def _varying(self):
        """Variables whose value may differ between threads (data flow only)."""
        out = set(self.coord)
        stmts = list(ir.walk(self.k.body))
        changed = True
        while changed:
            changed = False
            for s in stmts:
                if isinstance(s, ir.Assign) and s.target not in out:
                    e = s.expr
                    path = _intrinsic(e)
                    hit = path is not None and (path.startswith("threadIdx") or
                                                path in ("grid", "laneid"))
                    hit = hit or bool(ir.var_names(ir.operands(e)) & out)
                    if hit:
                        out.add(s.target)
                        changed = True
                elif isinstance(s, ir.ForRange) and s.index not in out:
                    if ir.var_names((s.start, s.stop, s.step)) & out:
                        out.add(s.index)
                        changed = True
        return out

    # ---- classification ------------------------------------------------------------
    def canonical(self, x, coord=None):
        """("c", root variable) for a thread coordinate, ("k", value) for an integer
        constant, else None: equal canonical index tuples denote the same element."""
        coord = self.coord if coord is None else coord
        if isinstance(x, ir.Const) and isinstance(x.value, int) and \
                not isinstance(x.value, bool):
            return ("k", x.value)
        if isinstance(x, ir.Var):
            if x.name in self.consts:
                return ("k", self.consts[x.name])
            if x.name in coord:
                return ("c", self.root.get(x.name, x.name))
        return None

    @staticmethod
    def shown(name, coord):
        """``name`` as a message shows it: a numba temporary (``$42unpack_sequence.7``)
        by a kernel variable holding the same thread coordinate, when there is one."""
        if not name.startswith("$") or name not in coord:
            return name
        same = sorted(v for v, d in coord.items() if d == coord[name] and "$" not in v)
        return same[0] if same else name

    def owned_key(self, idx, coord=None, ndim=None):
        """The canonical key of an access to one of the thread's own elements: thread
        coordinates (each launch dimension once) at some positions, integer constants
        at the others; None otherwise."""
        if (coord is None or coord is self.coord) and not self.coords_cover:
            return None
        coord = self.coord if coord is None else coord
        ndim = self.ndim if ndim is None else ndim
        key = tuple(self.canonical(x, coord) for x in idx)
        if None in key:
            return None
        dims = sorted(coord[x.name] for x, k in zip(idx, key) if k[0] == "c")
        return key if dims == list(range(ndim)) and ndim else None

    def coord_offset(self, x, _depth=0):
        """(dimension, constant) when x is a coordinate plus a constant (possibly in
        several steps: ``im = i - 1; ip = im + 2``), else None."""
        if not isinstance(x, ir.Var) or _depth > 8:
            return None
        if x.name in self.coord:
            return self.coord[x.name], 0
        e = self.defs.get(x.name)
        if isinstance(e, ir.Copy):
            return self.coord_offset(e.src, _depth + 1)
        if _op(e, operator.add) or _op(e, operator.sub):
            a, b = e.args
            sign = 1 if e.fn is operator.add else -1

            def const(y):
                if isinstance(y, ir.Const) and isinstance(y.value, int) and \
                        not isinstance(y.value, bool):
                    return y.value
                return self.consts.get(y.name) if isinstance(y, ir.Var) else None
            cb, ca = const(b), const(a)
            if cb is not None:
                inner = self.coord_offset(a, _depth + 1)
                if inner is not None:
                    return inner[0], inner[1] + sign * cb
            if ca is not None and sign == 1:
                inner = self.coord_offset(b, _depth + 1)
                if inner is not None:
                    return inner[0], inner[1] + ca
        return None

    def affine(self, x, coord=None, _depth=0):
        """(dimension, a, lo, hi) when ``x`` is ``a * c + b`` for a thread coordinate
        ``c`` of that dimension, an integer constant ``a > 0`` and an integer ``b`` in
        ``[lo, hi]`` with ``lo >= 0`` (constants, and counters of loops over constant
        ranges: ``3 * i + k`` for ``k in range(3)``), else None.  Such an index is never
        negative (a negative index would wrap around onto another thread's element)."""
        coord = self.coord if coord is None else coord
        if not isinstance(x, ir.Var) or _depth > 8:
            return None
        if x.name in coord:
            return coord[x.name], 1, 0, 0
        e = self.defs.get(x.name)
        if isinstance(e, ir.Copy):
            return self.affine(e.src, coord, _depth + 1)
        if not (_op(e, operator.add) or _op(e, operator.sub) or _op(e, operator.mul)):
            return None
        a, b = e.args
        if e.fn is operator.mul:
            for f, g in ((a, b), (b, a)):
                k = self._bounds(g)
                inner = self.affine(f, coord, _depth + 1)
                if inner is not None and k is not None and k[0] == k[1] and k[0] > 0:
                    d, m, lo, hi = inner
                    return d, m * k[0], lo * k[0], hi * k[0]
            return None
        inner, k = self.affine(a, coord, _depth + 1), self._bounds(b)
        if inner is None and e.fn is operator.add:
            inner, k = self.affine(b, coord, _depth + 1), self._bounds(a)
        if inner is None or k is None:
            return None
        d, m, lo, hi = inner
        lo, hi = (lo + k[0], hi + k[1]) if e.fn is operator.add else (lo - k[1], hi - k[0])
        return (d, m, lo, hi) if lo >= 0 else None

    def _bounds(self, x, _depth=0):
        """[lo, hi] of an integer that does not depend on the thread: a constant, a
        counter of a loop over a constant range, or sums and differences of them."""
        if isinstance(x, ir.Const):
            v = x.value
            return (v, v) if isinstance(v, int) and not isinstance(v, bool) else None
        if not isinstance(x, ir.Var) or _depth > 8:
            return None
        if x.name in self.consts:
            return self.consts[x.name], self.consts[x.name]
        loop = self.loops.get(x.name)
        if x.name in self.counters and loop is not None:
            ends = [self._bounds(y, _depth + 1) for y in (loop.start, loop.stop, loop.step)]
            if None in ends or any(lo != hi for lo, hi in ends) or ends[2][0] == 0:
                return None
            start, stop, step = (lo for lo, _ in ends)
            vals = range(start, stop, step)
            return (min(vals), max(vals)) if len(vals) else (0, 0)
        e = self.defs.get(x.name)
        if isinstance(e, ir.Copy):
            return self._bounds(e.src, _depth + 1)
        if _op(e, operator.add) or _op(e, operator.sub):
            p, q = (self._bounds(y, _depth + 1) for y in e.args)
            if p is None or q is None:
                return None
            return ((p[0] + q[0], p[1] + q[1]) if e.fn is operator.add else
                    (p[0] - q[1], p[1] - q[0]))
        return None

    def strided_key(self, indices, coord=None, ndim=None):
        """Do the index tuples ``indices`` (every access of one array) give each thread
        elements no other thread touches, by strides?  Each position holds an integer
        constant in every access, or in every access ``a * c + b`` (:meth:`affine`) with
        one and the same coordinate ``c`` and stride ``a``, the offsets ``b`` spanning
        less than ``a`` (``x[3 * i]``, ``x[3 * i + 1]``, ``x[3 * i + k]``); each launch
        dimension at one position.  Two threads differ in some coordinate, and there
        their elements differ by at least ``a`` minus the offsets' span.  Returns a
        description of the element pattern, or None."""
        if (coord is None or coord is self.coord) and not self.coords_cover:
            return None
        coord = self.coord if coord is None else coord
        ndim = self.ndim if ndim is None else ndim
        if not indices or not ndim or len({len(idx) for idx in indices}) != 1:
            return None
        shown = []
        dims = []
        for pos in range(len(indices[0])):
            forms = [self.affine(idx[pos], coord) for idx in indices]
            if all(f is None for f in forms):
                if any(self._bounds(idx[pos]) is None for idx in indices):
                    return None
                shown.append("const")
                continue
            if None in forms or len({(d, a) for d, a, _, _ in forms}) != 1:
                return None
            d, a = forms[0][:2]
            lo, hi = min(f[2] for f in forms), max(f[3] for f in forms)
            if hi - lo >= a:
                return None
            dims.append(d)
            shown.append(f"{a} * c{d} + ({lo}..{hi})" if a != 1 else f"c{d} + ({lo}..{hi})")
        if sorted(dims) != list(range(ndim)):
            return None
        return ", ".join(shown)

    def offset_coord(self, x):
        """(dimension) when x is a coordinate, or a coordinate plus/minus a constant."""
        co = self.coord_offset(x)
        return None if co is None else co[0]

    def classify(self, name, indices, space="global"):
        """:class:`ArrayClass` of array ``name`` accessed with ``indices`` (tuples of
        index operands, one per load/store/atomic).  ``space``: "global" (arguments),
        "shared" (``cuda.shared.array``: private means the thread's own element by
        ``threadIdx``) or "local" (``cuda.local.array``: always private)."""
        if space == "local":
            return ArrayClass(name, "private", "cuda.local.array: each thread has its own")
        coord, ndim = (self.coord, self.ndim) if space == "global" else (
            self.local, self.block_ndim)
        keys = set()
        private = True
        for idx in indices:
            # thread coordinates at fixed positions (all of them, once each); the
            # other positions constant: x[i], x[i, j], x[i, 0], x[i, 1] ...
            key = self.owned_key(idx, coord, ndim)
            if key is None:
                private = False
                break
            keys.add(tuple(k[1] if k[0] == "c" else None for k in key))
        if private and len(keys) == 1 and ndim:
            shown = ", ".join(self.shown(k, coord) if k is not None else "const"
                              for k in next(iter(keys)))
            return ArrayClass(name, "private", "every access uses the thread's own "
                              f"element(s) {name}[{shown}]")
        if space == "global" and not (private and len(keys) == 1):
            strided = self.strided_key(list(indices))
            if strided is not None:
                return ArrayClass(name, "private", "every access uses elements of the "
                                  f"thread alone, by strides: {name}[{strided}]")
        if private and len(keys) > 1:
            return ArrayClass(name, "arbitrary", "accessed with different thread indices")
        names = set()
        for idx in indices:
            names |= ir.var_names(idx)
        if not names & self.varying:
            return ArrayClass(name, "uniform", "the same element(s) for every thread")
        if all(all(self.offset_coord(x) is not None or isinstance(x, ir.Const)
                   for x in idx) for idx in indices):
            return ArrayClass(name, "neighbour", "thread coordinates plus or minus "
                              "constants: neighbouring threads share elements")
        return ArrayClass(name, "arbitrary", "the index is computed (index arrays, "
                          "arithmetic): threads may share elements")


def array_accesses(kernel):
    """{array name: [index tuple, ...]} over loads, stores and atomics."""
    acc = {}
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load):
            acc.setdefault(s.expr.array.name, []).append(tuple(s.expr.index))
        elif isinstance(s, ir.Store):
            acc.setdefault(s.array.name, []).append(tuple(s.index))
    return acc


def own_rows(index, kernel, names):
    """The arrays among ``names`` whose every access reaches a row of the running
    thread alone: a 1-D launch (``cuda.grid(1)``, the coordinates covering every index
    dimension the kernel reads), an array of two or more dimensions, and the first
    index of each load and store one and the same thread coordinate (``y[i, j]``, any
    column).  No other thread touches such a row; ``y[i + 1, j]`` is not one."""
    if index.ndim != 1 or not index.coords_cover:
        return set()
    acc = array_accesses(kernel)
    out = set()
    for name in names:
        t = kernel.types.get(name)
        idxs = acc.get(name, ())
        if getattr(t, "ndim", 0) < 2 or not idxs:
            continue
        firsts = {index.canonical(idx[0]) if len(idx) == t.ndim else None
                  for idx in idxs}
        if len(firsts) == 1 and None not in firsts and next(iter(firsts))[0] == "c":
            out.add(name)
    return out
