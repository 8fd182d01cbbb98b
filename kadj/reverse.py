"""Reverse: region tree + analyses + rules -> the adjoint as readable Python source.

The adjoint function has three parts:

1. set-up: adjoint accumulators for scalars, work copies of arrays the kernel both
   reads and writes (the user's arrays are never modified), tapes;
2. the forward sweep: the kernel's statements (dead ones removed), pushing on a tape
   each value the reverse sweep needs before the forward overwrites it, and the
   iteration count of loops that can exit early;
3. the reverse sweep: statements in reverse order, each adding its partial
   derivatives (from :mod:`kadj.rules`) times its adjoint into its operands' adjoints,
   popping overwritten values back.  ``for`` loops run backwards, recomputing at the
   top of each iteration the values :mod:`kadj.analysis` found recomputable.

The in/out rule of the adjoint buffers (API.md) falls out of this: a store consumes
the element's adjoint (sets it to zero after passing it on), a load accumulates.
"""
from __future__ import annotations

import builtins
import keyword
import math
import operator
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
from numba.core import types

from . import ir
from . import ops
from . import rules
from .analysis import partial_reads
from .errors import DifferentiationError

_INFIX = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.floordiv: "//", operator.mod: "%", operator.pow: "**",
    operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
    operator.eq: "==", operator.ne: "!=", operator.and_: "&", operator.or_: "|",
    operator.xor: "^", operator.lshift: "<<", operator.rshift: ">>",
}
_UNARY = {operator.neg: "-", operator.pos: "+", operator.not_: "not ", operator.invert: "~"}
# Names the generated code relies on: a user's name never shadows them.
RESERVED_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {
    "math", "np", "cuda", "numba", "float32", "float64", "int64", "_reserve", "_trips",
    "_push", "_sign", "_retval", "adj_return", "_tape_f64", "_tape_f32", "_tape_i64",
    "_sp_f64", "_sp_f32", "_sp_i64", "_p0", "_p1", "_p2", "_g0", "_g1", "_g2"}
_SYM_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_SYM_CMP = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_SYM_FUNCS = {"sin": "math.sin", "cos": "math.cos", "tan": "math.tan", "sinh": "math.sinh",
              "cosh": "math.cosh", "tanh": "math.tanh", "exp": "math.exp",
              "log": "math.log", "sqrt": "math.sqrt", "pow": "math.pow",
              "copysign": "math.copysign", "sign": "_sign", "floor": "math.floor",
              "trunc": "math.trunc"}


@dataclass(frozen=True)
class AdjointSource:
    name: str
    source: str
    namespace: dict
    param_names: tuple


class AdjRef(str):
    """The text of an adjoint array element (``adj_u[i - 1]``), remembering the array
    variable and the index operands it was made from."""

    def __new__(cls, text, array, index):
        obj = str.__new__(cls, text)
        obj.array, obj.index = array, tuple(index)
        return obj


@dataclass(eq=False)
class _Frame:
    """A region of the forward sweep whose pushes are reserved for together (see
    ``Writer.open_frame``).  The fields after ``trip_src`` are set while the frame is
    open (``counts``, ``children``, ``closed``) and when the tree is planned."""
    depth: int
    trip: object                 # trip-count text of a ``for`` loop, or None
    operands: set                # variables the trip count reads
    hoist: object                # a replayed iteration's hoisted reservation, or None
    assigned: object             # variables the loop body assigns; None: absorbs none
    parent: object
    cond: int                    # branch nesting where the frame opened
    body: tuple = ()
    trip_src: object = None      # the (start, stop, step) operands
    counts: dict = field(default_factory=dict)    # pushes per kind, per iteration
    children: list = field(default_factory=list)
    closed: object = None        # the push sequence number when the frame closed
    absorbed: bool = False       # its amount joined the parent's reservation
    foreign: object = None       # pushes after this sequence number are not covered
    records: bool = False        # the frame or a nested one pushes
    ops: set = field(default_factory=set)          # variables its amounts read
    terms: dict = field(default_factory=dict)      # per-iteration amounts, per kind
    amounts: dict = field(default_factory=dict)    # what it reserves, per kind
    _defs: object = None

    def single_defs(self):
        """The body's unconditional definitions of variables it assigns only once."""
        if self._defs is None:
            counts = {}
            for x in ir.walk(self.body):
                if isinstance(x, ir.Assign):
                    counts[x.target] = counts.get(x.target, 0) + 1
            self._defs = {x.target: x.expr for x in self.body
                          if isinstance(x, ir.Assign) and counts[x.target] == 1}
        return self._defs


class _Slot(str):
    """A placeholder line of the generated source (empty text), resolved once every
    frame of the sweep is closed (see ``Writer.close_frame``)."""

    def __new__(cls, **fields):
        obj = str.__new__(cls, "")
        obj.__dict__.update(fields)
        return obj


class _Reserve(_Slot):
    """Where a frame reserves tape room for the pushes it covers."""


class _PushCheck(_Slot):
    """Where a capacity check may be needed before one push."""

    def needed(self):
        """Is this push outside every reservation that could cover it?  A frame that
        reserves in place covers its pushes made before a nested frame reserved for
        itself, except in a ``for`` loop (its reservation is made once, at loop
        entry: later iterations run after the nested frame of an earlier one)."""
        f = self.frame
        while f is not None:
            at = f.foreign
            if at is not None and (f.trip is not None or self.seq > at):
                return True
            f = f.parent if f.absorbed else None
        return False


class Writer:
    def __init__(self, kernel, an, slot_args, returns_value, fname):
        self.k = kernel
        self.a = an
        self.T = kernel.types
        self.slot_args = tuple(slot_args)
        self.returns_value = returns_value
        self.fname = fname
        self.lines = []
        self.ns = {"math": math, "np": np}
        self.names = {}
        self.tmp = 0
        self.used = set(RESERVED_NAMES) | {fname}
        self.derived = {}
        self.derived_of = {}
        self.counter = 0
        self.tapes = set()
        self.frames = []
        self._push_seq = 0
        self._cond_level = 0
        self.nopush = False
        self.skip_stores = False
        self.suppressed = frozenset()
        self.accumulators = {}
        self._last_loc = None
        for arg in kernel.args:
            self.names[arg] = self.unique(re.sub(r"\W", "_", arg) or "arg")

    # ---- naming ---------------------------------------------------------------
    # Every identifier of the generated source is taken from one registry
    # (``self.used``), seeded with the names the generated code itself relies on
    # (Python keywords and builtins, ``math``, ``np``, ``cuda``, kadj's helpers, tape
    # names): a user's name that collides with any of them, or with a generated name
    # (``adj_x`` beside ``x``, ``t1``, ``u_work``), gets a suffix instead.
    def unique(self, base):
        """``base``, or ``base_2``, ``base_3``, ...: the first name not yet used."""
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def _derived(self, kind, var, make):
        key = (kind, var)
        if key not in self.derived:
            self.derived[key] = self.unique(make(self.n(var)))
            self.derived_of[self.derived[key]] = key
        return self.derived[key]

    def n(self, var):
        if var in self.names:
            return self.names[var]
        helper = re.match(r"^(?P<fn>[A-Za-z_]\w*?)_v\d+_(?P<rest>[\w.]+)$", var)
        if var.startswith("$") or (helper and helper.group("rest").startswith("_v")):
            self.tmp += 1
            base = f"t{self.tmp}"
        elif helper:
            rest = re.sub(r"\W", "_", helper.group("rest"))  # t.1: numba's versions
            base = f"{rest}_{helper.group('fn').strip('_')}"
        else:
            base = re.sub(r"\W", "_", var).strip("_") or "v"
            if base[0].isdigit():
                base = "v" + base
        name = self.unique(base)
        self.names[var] = name
        return name

    def arr(self, var):
        """Name of an array as the forward sweep sees it (work copy if written)."""
        if var in self.a.work_arrays:
            return self._derived("work", var, lambda n: n + "_work")
        return self.n(var)

    def adj(self, var):
        """Name of the adjoint of ``var`` (``adj_<name>``)."""
        return self._derived("adj", var, lambda n: "adj_" + n)

    def adj_buf(self, var):
        """Name of the 1-element adjoint buffer of the scalar argument ``var``."""
        return self._derived("buf", var, lambda n: f"adj_{n}_buf")

    def fresh(self, base):
        while True:
            self.counter += 1
            name = f"_{base}{self.counter}"
            if name not in self.used:
                break
        self.used.add(name)
        return name

    @staticmethod
    def elem(base, index_texts):
        """``base[i, j]``; ``base[()]`` for a 0-d array."""
        return f"{base}[{', '.join(index_texts) or '()'}]"

    # ---- rendering ----------------------------------------------------------------
    def emit(self, depth, text):
        self.lines.append("    " * depth + text)

    def comment(self, depth, loc):
        if loc is None or loc == self._last_loc:
            return
        self._last_loc = loc
        src = ""
        try:
            src = _source_line(loc)
        except Exception:
            src = ""
        fname = (loc.filename or "").split("/")[-1]
        self.emit(depth, f"# {fname}:{loc.line}: {src}".rstrip())

    def o(self, x):
        if isinstance(x, ir.Var):
            t = self.T.get(x.name)
            if isinstance(t, types.Array):
                return self.arr(x.name)
            return self.n(x.name)
        if isinstance(x, ir.Const):
            v = x.value
            if isinstance(v, (bool, np.bool_)):
                return repr(bool(v))
            if isinstance(v, (float, np.floating)) and (math.isinf(v) or math.isnan(v)):
                text = "math.nan" if math.isnan(v) else (
                    "math.inf" if v > 0 else "(-math.inf)")
                if isinstance(v, np.float32):
                    return f"np.float32({text})"
                return text
            if isinstance(v, np.floating):
                return f"np.{type(v).__name__}({float(v)!r})"
            if isinstance(v, np.integer):
                return repr(int(v))
            return repr(v)
        if isinstance(x, ir.GlobalRef):
            return self.bind(x.value, x.name or "g")
        raise TypeError(x)

    def bind(self, obj, hint):
        nm = getattr(obj, "__name__", None)
        if isinstance(nm, str) and getattr(builtins, nm, None) is obj:
            return nm  # builtins' names are reserved: no kernel name shadows them
        for mod, prefix in ((np, "np"), (math, "math")):
            with warnings.catch_warnings():  # e.g. numpy's FutureWarning for np.str
                warnings.simplefilter("ignore")
                found = getattr(mod, nm, None) if isinstance(nm, str) else None
            if found is obj:
                return f"{prefix}.{nm}"
        for k, v in self.ns.items():
            if v is obj:
                return k
        base = "_" + re.sub(r"\W", "_", hint.split(".")[-1])
        name = base
        i = 1
        while name in self.ns or name in self.used:
            i += 1
            name = f"{base}{i}"
        self.used.add(name)
        self.ns[name] = obj
        return name

    def expr(self, e):
        if isinstance(e, ir.Copy):
            return self.o(e.src)
        if isinstance(e, ir.Load):
            return self.elem(self.arr(e.array.name), [self.o(i) for i in e.index])
        if isinstance(e, ir.Attr):
            return f"{self.n(e.value.name)}.{e.attr}"
        if isinstance(e, ir.Item):
            return f"{self.n(e.value.name)}[{e.index}]"
        if isinstance(e, (ir.Op, ir.Alloc)):
            if isinstance(e, ir.Op) and e.fn in _INFIX and len(e.args) == 2 and not e.kws:
                return f"{self.o(e.args[0])} {_INFIX[e.fn]} {self.o(e.args[1])}"
            if isinstance(e, ir.Op) and e.fn is ir.make_tuple:
                items = [self.o(x) for x in e.args]
                return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
            if isinstance(e, ir.Op) and e.fn in _UNARY and len(e.args) == 1:
                return f"{_UNARY[e.fn]}{self.o(e.args[0])}"
            f = self.bind(e.fn, getattr(e.fn, "__name__", "f"))
            args = [self.o(x) for x in e.args] + [f"{k}={self.o(v)}" for k, v in e.kws]
            return f"{f}({', '.join(args)})"
        raise TypeError(e)

    def zero(self, var_type):
        if isinstance(var_type, types.Float):
            return "0.0" if var_type.bitwidth == 64 else f"np.{var_type}(0.0)"
        if isinstance(var_type, types.Boolean):
            return "False"
        if isinstance(var_type, types.Integer):
            return "0"
        return "0.0"

    def sym(self, s, dtype):
        if s.kind == "var":
            return self.n(s.name) if s.name != ir.COTANGENT else self._g
        if s.kind == "const":
            v = s.value
            if isinstance(dtype, types.Float) and dtype.bitwidth == 32:
                return f"np.float32({v!r})"
            return repr(v)
        args = [self.sym(x, dtype) for x in s.args]
        if s.name in _SYM_INFIX:
            return f"({args[0]} {_SYM_INFIX[s.name]} {args[1]})"
        if s.name == "neg":
            return f"(-{args[0]})"
        if s.name in ("eq", "ne"):
            return f"({args[0]} {'==' if s.name == 'eq' else '!='} {args[1]})"
        if s.name in _SYM_CMP:
            return f"({args[0]} {_SYM_CMP[s.name]} {args[1]})"
        if s.name == "land":
            return f"({args[0]} and {args[1]})"
        if s.name == "where":
            return f"({args[1]} if {args[0]} else {args[2]})"
        if s.name == "sign":
            one = self.sym(ops.const(1.0), dtype)
            zero = self.sym(ops.const(0.0), dtype)
            x = args[0]
            return f"({one} if {x} > 0 else (-{one} if {x} < 0 else {zero}))"
        return f"{_SYM_FUNCS[s.name]}({', '.join(args)})"

    def cast(self, text, target_type):
        if isinstance(target_type, types.Float) and target_type.bitwidth == 32:
            return f"np.float32({_strip(text)})"
        return _strip(text)

    # ---- tapes -------------------------------------------------------------------
    def tape_of(self, t):
        if isinstance(t, types.Float):
            kind = "f32" if t.bitwidth == 32 else "f64"
        else:
            kind = "i64"
        self.tapes.add(kind)
        return f"_tape_{kind}", f"_sp_{kind}"

    def push(self, depth, value_text, t):
        if self.nopush:
            return
        tape, sp = self.tape_of(t)
        if not isinstance(t, (types.Float,)):
            value_text = f"int({value_text})"
        frame = self.frames[-1]
        kind = tape[len("_tape_"):]
        if self.growable_tape:
            self._push_seq += 1
            self.lines.append(_PushCheck(frame=frame, kind=kind, depth=depth,
                                         seq=self._push_seq))
        self.emit(depth, f"{tape}[{sp}] = {value_text}")
        self.emit(depth, f"{sp} += 1")
        frame.counts[kind] = frame.counts.get(kind, 0) + 1

    # Tape capacity, by construction.  The pushes of a sweep are grouped in frames:
    # the whole sweep, each loop (per loop entry for ``for``, per iteration for
    # ``while``) and each replayed iteration.  A frame reserves, where it starts, room
    # for its own pushes (trip count x pushes per iteration for a ``for`` loop).  A
    # nested frame whose trip count is known where the enclosing frame starts (it
    # reads no variable the enclosing loop assigns) and that runs on every iteration
    # is absorbed: its amount joins the enclosing reservation.  When a nested frame
    # that records cannot be absorbed, it reserves for itself where it starts, which
    # moves the tape pointer past what the enclosing reservation counted: the
    # enclosing frame is then *foreign* from that point on, and each of its pushes
    # not provably covered gets a capacity check (`_PushCheck`).  So every push is
    # either inside a reservation that covers it or checked.  The decisions need the
    # whole frame tree, so reservations and checks are placeholders until the
    # outermost frame closes.
    growable_tape = True

    def open_frame(self, depth, trip=None, operands=(), hoist=None, assigned=None,
                   body=(), trip_src=None):
        """Start a frame (see above).  ``trip``: the trip-count text of a ``for``
        loop; ``operands``: the variables it reads; ``assigned``: the variables the
        loop body assigns (None: nothing can be absorbed); ``hoist``: a replayed
        iteration, whose reservation goes in front of the reversed loop (the tape is
        back at the same height after each reversed iteration).  ``body``: the loop
        body (its loop-invariant definitions let a nested trip count be computed
        before the loop); ``trip_src``: the (start, stop, step) operands."""
        parent = self.frames[-1] if self.frames else None
        if hoist is not None:
            assigned = hoist["assigned"]
        fr = _Frame(depth=depth, trip=trip, operands=set(operands), hoist=hoist,
                    assigned=assigned, parent=parent, cond=self._cond_level,
                    body=tuple(body), trip_src=trip_src)
        if parent is not None:
            parent.children.append(fr)
        self.frames.append(fr)
        self.lines.append(_Reserve(frame=fr))

    def close_frame(self):
        fr = self.frames.pop()
        fr.closed = self._push_seq
        if not self.frames:
            self._plan_frame(fr)
            self._resolve_slots()

    def _plan_frame(self, fr):
        """Decide, bottom-up, which frames are absorbed, each frame's amounts, and
        where each frame stops covering its own pushes."""
        for c in fr.children:
            self._plan_frame(c)
        recording = [c for c in fr.children if c.records]
        fr.records = bool(fr.counts) or bool(recording)
        terms = {kind: [str(n)] for kind, n in fr.counts.items()}
        ops = set(fr.operands)
        absorbed = {}
        if fr.assigned is not None:
            for c in recording:
                found = self._absorbable(c, fr)
                if found is None:
                    break
                absorbed[id(c)] = found
        if recording and len(absorbed) == len(recording):
            for c in recording:
                c.absorbed = True
                amounts, c_ops = absorbed[id(c)]
                ops |= c_ops
                for kind, amount in amounts.items():
                    terms.setdefault(kind, []).append(amount)
        elif recording:
            fr.foreign = min(c.closed for c in recording)
        fr.ops = ops
        fr.terms = terms
        fr.amounts = self._amounts(terms, fr.trip)
        if fr.hoist is not None:
            for kind, amount in fr.amounts.items():
                fr.hoist["amounts"].setdefault(kind, []).append(amount)

    @staticmethod
    def _amounts(terms, trip):
        """Tape entries per kind: the per-iteration terms, times the trip count."""
        amounts = {}
        for kind, ts in sorted(terms.items()):
            per = " + ".join(ts)
            if trip is None:
                amounts[kind] = per
            elif per == "1":
                amounts[kind] = trip
            else:
                amounts[kind] = f"{per if len(ts) == 1 else f'({per})'} * {trip}"
        return amounts

    def _absorbable(self, c, fr):
        """The amounts of nested frame ``c`` as computed where ``fr`` reserves and
        the variables they read, or None when ``c`` cannot join ``fr``'s reservation: it checks its own pushes,
        runs under a branch, or its trip count depends on the loop's own variables
        (loop-invariant definitions such as ``n = x.shape[0]`` in the loop body are
        computed again in front of the loop)."""
        if c.foreign is not None or c.cond != fr.cond:
            return None
        clash = c.ops & fr.assigned
        if not clash:
            return c.amounts, c.ops
        if c.trip_src is None or clash - c.operands or \
                (c.ops - c.operands) & fr.assigned:
            return None
        leaves = set()
        texts = [self._invariant(x, fr.single_defs(), fr.assigned, 0, leaves)
                 for x in c.trip_src]
        if any(t is None for t in texts):
            return None
        return (self._amounts(c.terms, f"_trips({', '.join(texts)})"),
                (c.ops - clash) | leaves)

    def _invariant(self, x, defs, assigned, depth, leaves):
        """Text of operand ``x`` computed in front of a loop: ``x`` itself when the
        loop does not assign it, else its single, unconditional definition in the
        body when that is a shape, a tuple item, or + - * of such values."""
        if not isinstance(x, ir.Var) or x.name not in assigned:
            leaves |= ir.var_names((x,))
            return self.o(x)
        e = defs.get(x.name)
        if e is None or depth > 8:
            return None

        def sub(y):
            return self._invariant(y, defs, assigned, depth + 1, leaves)
        if isinstance(e, ir.Copy):
            return sub(e.src)
        if isinstance(e, ir.Attr) and e.attr == "shape":
            base = sub(e.value)
            return None if base is None else f"{base}.shape"
        if isinstance(e, ir.Item) and isinstance(e.index, int):
            base = sub(e.value)
            return None if base is None else f"{base}[{e.index}]"
        if isinstance(e, ir.Op) and not e.kws and len(e.args) == 2 and \
                e.fn in (operator.add, operator.sub, operator.mul):
            a, b = sub(e.args[0]), sub(e.args[1])
            if a is None or b is None:
                return None
            return f"({a} {_INFIX[e.fn]} {b})"
        return None

    def _resolve_slots(self):
        out = []
        for line in self.lines:
            if isinstance(line, _PushCheck):
                if line.needed():
                    out += self._reserve_lines({line.kind: "1"}, line.depth)
            elif isinstance(line, _Reserve):
                fr = line.frame
                if not fr.absorbed and fr.hoist is None:
                    out += self._reserve_lines(fr.amounts, fr.depth)
            else:
                out.append(line)
        self.lines = out

    def _reserve_lines(self, amounts, depth):
        lines = []
        pad = "    " * depth
        for kind, amount in sorted(amounts.items()):
            lines.append(f"{pad}if _sp_{kind} + {amount} > _tape_{kind}.shape[0]:")
            lines.append(f"{pad}    _tape_{kind} = _reserve(_tape_{kind}, _sp_{kind} + {amount})")
        return lines

    def pop(self, depth, target_text, t):
        tape, sp = self.tape_of(t)
        self.emit(depth, f"{sp} -= 1")
        val = f"{tape}[{sp}]"
        if isinstance(t, types.Boolean):
            val = f"{val} != 0"
        self.emit(depth, f"{target_text} = {val}")

    # ---- liveness of the forward sweep ------------------------------------------
    def liveness(self):
        a = self.a
        rvars = set()
        for rv in a.recompute_vars.values():
            rvars |= rv
        from .analysis import _reads_outside
        checkpointed = set()
        for s in ir.walk(self.k.body):
            if isinstance(s, (ir.ForRange, ir.Loop)) and s.uid in a.replay:
                carried = a.checkpoint.get(s.uid, ())  # restored from checkpoints
                for v in ir.assigned(s.body):
                    if v not in carried and not _reads_outside(a, s, {v}):
                        rvars.add(v)
                checkpointed |= set(carried)
        live_out = (set(a.needed) - rvars) | checkpointed
        self.kept = set()
        self._nopush_live = False
        self._live(self.k.body, live_out, None)

    def _stmt_needed(self, s):
        a = self.a
        if isinstance(s, ir.Assign):
            if s.target in a.pushed and not self._nopush_live:
                return True
            if isinstance(s.expr, ir.Alloc):
                return s.target in a.loaded or s.target in a.varied_arrays
            return False
        if isinstance(s, ir.Store):
            return s.array.name in a.loaded
        if isinstance(s, ir.Return):
            return True
        return False

    def _live(self, stmts, live, ctx):
        for s in reversed(stmts):
            if isinstance(s, ir.Assign):
                if s.target in live or self._stmt_needed(s) or (
                        isinstance(s.expr, ir.Alloc) and s.target in live):
                    self.kept.add(id(s))
                    live = (live - {s.target}) | ir.stmt_reads(s)
                    if s.target in self.a.pushed and not self._nopush_live:
                        live = live | {s.target}
            elif isinstance(s, ir.Store):
                if self._stmt_needed(s):
                    self.kept.add(id(s))
                    live = live | ir.stmt_reads(s)
            elif isinstance(s, ir.Return):
                self.kept.add(id(s))
                live = live | (ir.stmt_reads(s) if self.has_retval else set())
            elif isinstance(s, ir.Barrier):
                if self.keep_barriers:
                    self.kept.add(id(s))
            elif isinstance(s, ir.Break):
                self.kept.add(id(s))
                live = set(ctx[0])
            elif isinstance(s, ir.Continue):
                self.kept.add(id(s))
                live = set(ctx[1])
            elif isinstance(s, ir.If):
                l1 = self._live(s.then, live, ctx)
                l2 = self._live(s.orelse, live, ctx)
                inner = any(id(x) in self.kept for x in ir.walk(s.then + s.orelse))
                if inner:
                    self.kept.add(id(s))
                    live = l1 | l2 | ir.stmt_reads(s)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                out = set(live)
                head = set(live)
                saved_np = self._nopush_live
                if s.uid in self.a.replay:
                    self._nopush_live = True
                for _ in range(4):
                    body_in = self._live(s.body, head, (out, head))
                    new_head = head | body_in
                    if isinstance(s, ir.ForRange):
                        new_head.discard(s.index)
                    if new_head == head:
                        break
                    head = new_head
                inner = any(id(x) in self.kept for x in ir.walk(s.body))
                self._nopush_live = saved_np
                counted = self.a.has_rev.get(id(s)) and (
                    not self._nopush_live or s.uid in self.a.checkpoint) and (
                    isinstance(s, ir.Loop) or self._counted(s))
                if inner or counted:
                    self.kept.add(id(s))
                    live = head | out | ir.stmt_reads(s)
                    if isinstance(s, ir.ForRange):
                        live.discard(s.index)
        return live

    def find_single_use(self):
        """Variables defined once and read once, later in the same statement sequence:
        their adjoint is assigned (not accumulated) at the use and read at the def."""
        a = self.a
        uses, where_def, where_use = {}, {}, {}

        def visit(seq):
            for pos, s in enumerate(seq):
                if isinstance(s, ir.Assign):
                    where_def[s.target] = (id(seq), pos)
                    ops_ = ir.operands(s.expr)
                elif isinstance(s, ir.Store):
                    ops_ = (s.array,) + tuple(s.index) + (s.value,)
                elif isinstance(s, ir.If):
                    ops_ = (s.cond,)
                    visit(s.then)
                    visit(s.orelse)
                elif isinstance(s, ir.ForRange):
                    ops_ = (s.start, s.stop, s.step)
                    visit(s.body)
                elif isinstance(s, ir.Loop):
                    ops_ = ()
                    visit(s.body)
                elif isinstance(s, ir.Return):
                    ops_ = (s.value,) if s.value is not None else ()
                else:
                    ops_ = ()
                for x in ops_:
                    if isinstance(x, ir.Var):
                        uses[x.name] = uses.get(x.name, 0) + 1
                        where_use[x.name] = (id(seq), pos)

        visit(self.k.body)
        out = set()
        for v in a.varied:
            if v in self.k.args or v in a.pushed or a.assign_count.get(v) != 1:
                continue
            if uses.get(v) == 1 and v in where_def and v in where_use and \
                    where_def[v][0] == where_use[v][0] and where_def[v][1] < where_use[v][1]:
                out.add(v)
        self.single_use = out

    # ---- the function ------------------------------------------------------------
    def write(self):
        k, a = self.k, self.a
        self.liveness()
        self.find_single_use()
        params = self.adjoint_params()
        body_start = len(self.lines)
        # forward and reverse sweeps are written first, set-up is prepended after
        self.emit(1, "# ---- forward sweep ----")
        self.open_frame(1)
        self.fwd(k.body, 1, loop_depth=0)
        self.close_frame()
        self.emit(1, "# ---- reverse sweep ----")
        self._last_loc = None
        self.rev(k.body, 1, loop_depth=0)
        self.finish_scalar_adjoints([
            name for name in self.slot_args
            if not isinstance(self.T.get(name), types.Array) and name in a.varied])
        self.emit(1, "return _retval" if self.has_retval else "return None")
        main = self.lines[body_start:]
        self.lines = []
        self.emit(0, f"def {self.fname}({', '.join(params)}):")
        self.emit(1, f'"""Adjoint of {k.name}: forward sweep, then reverse sweep '
                     f'(generated by kadj)."""')
        for name in sorted(a.work_arrays):
            self.emit(1, f"{self.arr(name)} = {self.n(name)}.copy()")
        for line in self.tape_init_lines():
            self.emit(1, line)
        inits = []
        for v in sorted(sorted(a.varied), key=self.n):  # unnamed ones: in a fixed order
            if isinstance(self.T.get(v), types.Float) and v not in self.single_use:
                inits.append(f"{self.adj(v)} = {self.zero(self.T[v])}")
        for v in sorted(sorted(self.declare), key=self.n):
            inits.append(f"{self.n(v)} = {self.zero(self.T.get(v))}")
        if self.has_retval:
            inits.append(f"_retval = {self.zero(k.return_type)}")
        for line in inits:
            self.emit(1, line)
        self.lines += main
        from .runtime_helpers import _reserve, _trips
        self.ns["_reserve"] = _reserve
        self.ns["_trips"] = _trips
        return "\n".join(self.lines) + "\n", tuple(params)

    def adjoint_params(self):
        """The adjoint's parameters: the forward's, one adjoint per slot (a scalar's is a
        1-element ``adj_<name>_buf``), then ``adj_return`` for a returned value."""
        params = [self.n(a) for a in self.k.args]
        for name in self.slot_args:
            params.append(self.adj(name) if isinstance(self.T.get(name), types.Array)
                          else self.adj_buf(name))
        if self.returns_value:
            params.append("adj_return")
        return params

    def replay_store(self, s):
        """Does a replayed iteration execute this store?  (Not into arrays: they hold
        their final contents, which the reverse sweep reads.)"""
        return False

    def alloc(self, s, depth):
        """A scratch array allocated by the kernel, and its adjoint (zeros)."""
        self.emit(depth, f"{self.n(s.target)} = {self.expr(s.expr)}")
        if s.target in self.a.varied_arrays:
            self.emit(depth, f"{self.adj(s.target)} = np.zeros_like({self.n(s.target)})")

    # ---- barriers (a target that has them overrides these) -------------------------
    keep_barriers = False      # the forward sweep runs the barriers

    def fwd_barrier(self, s, depth):
        raise DifferentiationError("barriers exist only in GPU kernels", kernel=self.k.name,
                                   loc=s.loc, construct="barrier")

    def rev_barrier(self, s, depth):
        self.fwd_barrier(s, depth)

    def finish_scalar_adjoints(self, names):
        """Add the adjoints of scalar arguments into their 1-element buffers."""
        for name in names:
            self.emit(1, f"{self.adj_buf(name)}[0] += {self.cast(self.adj(name), self.T[name])}")

    def tape_init_lines(self):
        lines = []
        for kind in sorted(self.tapes):
            dt = {"f64": "np.float64", "f32": "np.float32", "i64": "np.int64"}[kind]
            lines.append(f"_tape_{kind} = np.empty(1024, {dt})")
            lines.append(f"_sp_{kind} = 0")
        return lines

    @property
    def has_retval(self):
        return isinstance(self.k.return_type, (types.Number, types.Boolean))

    @property
    def declare(self):
        # variables pushed (may be read before their first assignment in a loop)
        out = set()
        for v in self.a.pushed:
            if v not in self.k.args:
                out.add(v)
        return out

    # ---- forward sweep -------------------------------------------------------------
    def fwd(self, stmts, depth, loop_depth):
        a = self.a
        start = len(self.lines)
        for s in stmts:
            if id(s) not in self.kept:
                continue
            if isinstance(s, ir.Assign):
                self.comment(depth, s.loc)
                if s.target in a.pushed and s.target not in self.suppressed and \
                        id(s) not in a.replay_fresh:
                    self.push(depth, self.n(s.target), self.T[s.target])
                if isinstance(s.expr, ir.Alloc):
                    self.alloc(s, depth)
                    continue
                self.emit(depth, f"{self.n(s.target)} = {self.expr(s.expr)}")
            elif isinstance(s, ir.Store):
                if self.skip_stores and not self.replay_store(s):
                    continue
                self.comment(depth, s.loc)
                ref = self.elem(self.arr(s.array.name), [self.o(i) for i in s.index])
                if s.array.name in a.restore_arrays:
                    self.push(depth, ref, self.T[s.array.name].dtype)
                op = {"add": "+=", "sub": "-="}.get(s.accumulate, "=")
                self.emit(depth, f"{ref} {op} {self.o(s.value)}")
            elif isinstance(s, ir.If):
                self.emit(depth, f"if {self.o(s.cond)}:")
                self._cond_level += 1
                self.fwd(s.then, depth + 1, loop_depth)
                if any(id(x) in self.kept for x in s.orelse):
                    self.emit(depth, "else:")
                    self.fwd(s.orelse, depth + 1, loop_depth)
                self._cond_level -= 1
            elif isinstance(s, ir.ForRange):
                self.fwd_for(s, depth, loop_depth)
            elif isinstance(s, ir.Loop):
                self.fwd_loop(s, depth, loop_depth)
            elif isinstance(s, ir.Break):
                self.emit(depth, "break")
            elif isinstance(s, ir.Continue):
                self.emit(depth, "continue")
            elif isinstance(s, ir.Return):
                if s.value is not None and self.has_retval:
                    self.emit(depth, f"_retval = {self.o(s.value)}")
            elif isinstance(s, ir.Barrier):
                self.fwd_barrier(s, depth)
        if all(line.lstrip().startswith("#") for line in self.lines[start:]):
            self.emit(depth, "pass")

    def _counted(self, loop):
        return any(isinstance(x, ir.Break) for x in ir.walk_level(loop.body))

    def fwd_for(self, s, depth, loop_depth):
        a = self.a
        idx = self.n(s.index)
        if s.uid in a.index_saved:
            self.push(depth, idx, self.T[s.index])
        self.comment(depth, s.loc)
        counted = self._counted(s) and a.has_rev.get(id(s))
        if counted:
            cnt = self._count_name(s)
            self.emit(depth, f"{cnt} = 0")
        saved_vars = a.loop_saved.get(s.uid, ())
        for v in saved_vars:
            self.push(depth, self.n(v), self.T[v])
        replay = s.uid in a.replay and not self.nopush
        if replay:
            for v in a.replay[s.uid]:
                self.push(depth, self.n(v), self.T[v])
        lo, hi, st = self.o(s.start), self.o(s.stop), self.o(s.step)
        self.open_frame(depth, trip=f"_trips({lo}, {hi}, {st})",
                        operands=ir.var_names((s.start, s.stop, s.step)),
                        assigned=ir.assigned(s.body) | {s.index}, body=s.body,
                        trip_src=(s.start, s.stop, s.step))
        if replay:
            self.emit(depth, "# (not recorded here: each reversed iteration replays "
                             "its own forward part)")
        self.emit(depth, f"for {idx} in range({lo}, {hi}, {st}):")
        if counted:
            self.emit(depth + 1, f"{cnt} += 1")
        saved = self.nopush, self.suppressed
        self.nopush = self.nopush or replay
        self.suppressed = self.suppressed | set(saved_vars)
        self.fwd(s.body, depth + 1, loop_depth + 1)
        self.nopush, self.suppressed = saved
        self.close_frame()
        if counted and loop_depth > 0:
            self.push(depth, cnt, types.int64)

    def fwd_loop(self, s, depth, loop_depth):
        counted = self.a.has_rev.get(id(s))
        cnt = self._count_name(s)
        self.comment(depth, s.loc)
        saved_vars = self.a.loop_saved.get(s.uid, ())
        for v in saved_vars:
            self.push(depth, self.n(v), self.T[v])
        if counted:
            self.emit(depth, f"{cnt} = 0")
        self.emit(depth, "while True:")
        if counted:
            self.emit(depth + 1, f"{cnt} += 1")
        self.open_frame(depth + 1, assigned=ir.assigned(s.body), body=s.body)
        saved = self.suppressed
        self.suppressed = self.suppressed | set(saved_vars)
        self.fwd(s.body, depth + 1, loop_depth + 1)
        self.suppressed = saved
        self.close_frame()
        if counted and loop_depth > 0:
            self.push(depth, cnt, types.int64)

    def _count_name(self, loop):
        key = ("count", loop.uid)
        if key not in self.names:
            self.names[key] = self.fresh("trips")
        return self.names[key]

    # ---- reverse sweep -------------------------------------------------------------
    def rev(self, stmts, depth, loop_depth, recomputed=frozenset()):
        a = self.a
        start = len(self.lines)
        for s in reversed(stmts):
            if isinstance(s, (ir.ForRange, ir.Loop)) and not a.has_rev.get(id(s)) and \
                    id(s) in self.kept:
                self.pop_loop_saves(s, depth)  # values the forward saved around it
                continue
            if not self.needs_reverse(s):
                continue
            if isinstance(s, ir.Assign):
                self.rev_assign(s, depth, recomputed)
            elif isinstance(s, ir.Store):
                self.rev_store(s, depth)
            elif isinstance(s, ir.If):
                def has(seq):
                    return any(self.needs_reverse(x) for x in seq)
                if not has(s.then) and has(s.orelse):
                    self.emit(depth, f"if not {self.o(s.cond)}:")
                    self.rev(s.orelse, depth + 1, loop_depth, recomputed)
                    continue
                self.emit(depth, f"if {self.o(s.cond)}:")
                self.rev(s.then, depth + 1, loop_depth, recomputed)
                if has(s.orelse):
                    self.emit(depth, "else:")
                    self.rev(s.orelse, depth + 1, loop_depth, recomputed)
            elif isinstance(s, ir.ForRange):
                self.rev_for(s, depth, loop_depth)
            elif isinstance(s, ir.Loop):
                self.rev_loop(s, depth, loop_depth)
            elif isinstance(s, ir.Barrier):
                self.rev_barrier(s, depth)
            elif isinstance(s, ir.Return):
                if a.active(s.value) and self.returns_value:
                    self.comment(depth, s.loc)
                    t = self.T[s.value.name]
                    op = "=" if s.value.name in self.single_use else "+="
                    self.emit(depth, f"{self.adj(s.value.name)} {op} "
                                     f"{self.cast('adj_return', t)}")
        if all(line.lstrip().startswith("#") for line in self.lines[start:]):
            self.emit(depth, "pass")

    def rev_assign(self, s, depth, recomputed):
        a = self.a
        v = s.target
        active = v in a.varied
        if active:
            self.comment(depth, s.loc)
            adjv = self.adj(v)
            self_ref = any(isinstance(x, ir.Var) and x.name == v for x in ir.operands(s.expr))
            if self_ref:
                # v = f(v): the rule needs the new v (out) and the old v (operand)
                g = self.fresh("g")
                self.emit(depth, f"{g} = {adjv}")
                self.emit(depth, f"{adjv} = {self.zero(self.T[v])}")
                out_name = self.fresh("out")
                self.emit(depth, f"{out_name} = {self.n(v)}")
                if v in a.pushed and v not in recomputed and v not in self.suppressed:
                    self.pop(depth, self.n(v), self.T[v])
                for target, text in self.contributions(s, g=g, out_name=out_name):
                    op = "=" if self._is_single_adj(target) else "+="
                    self.accumulate(depth, target, op, text)
                return
            contribs = self.contributions(s)
            reset = v not in self.single_use and (
                a.assign_count.get(v, 0) > 1 or v in a.in_loop or any(
                    isinstance(x, ir.Var) and x.name == v for x in ir.operands(s.expr)))
            if contribs:
                self._g = adjv
                if reset and any(t == v for t, _ in contribs):
                    self._g = self.fresh("g")
                    self.emit(depth, f"{self._g} = {adjv}")
                    self.emit(depth, f"{adjv} = {self.zero(self.T[v])}")
                    reset = False
                for target, text in contribs:
                    op = "=" if self._is_single_adj(target) else "+="
                    self.accumulate(depth, target, op, text)
            if reset:
                self.emit(depth, f"{adjv} = {self.zero(self.T[v])}")
        if v in a.pushed and v not in recomputed and v not in self.suppressed and \
                id(s) not in a.replay_fresh:
            self.pop(depth, self.n(v), self.T[v])

    def contributions(self, s, g=None, out_name=None):
        """(adjoint target text, contribution text) pairs for an active assignment."""
        a = self.a
        e = s.expr
        v = s.target
        out = []
        if isinstance(e, ir.Copy):
            if a.active(e.src):
                out.append((self.adj(e.src.name), self.cast(g or self.adj(v),
                                                            self.T[e.src.name])))
        elif isinstance(e, ir.Load):
            arr = e.array.name
            if arr in a.varied_arrays:
                ref = AdjRef(self.elem(self.adj(arr), [self.o(i) for i in e.index]),
                             arr, tuple(e.index))
                ref = self.accumulators.get((arr, tuple(e.index)), ref)
                out.append((ref, self.cast(g or self.adj(v), self.T[arr].dtype)))
        elif isinstance(e, ir.Op):
            rule = rules.lookup(e.fn)
            if rule is None:
                name = getattr(e.fn, "__name__", str(e.fn))
                raise DifferentiationError(
                    f"no derivative rule for {name}()", kernel=self.k.name, loc=s.loc,
                    construct=f"call to {name}",
                    remedy=f"register one with @kadj.register_adjoint({name})")
            args = []
            for x in e.args:
                if isinstance(x, ir.Var):
                    args.append(ops.var(x.name))
                elif isinstance(x, ir.Const) and isinstance(x.value, (int, float, np.number)):
                    args.append(ops.const(x.value))
                else:
                    args.append(ops.const(0.0))
            contribs = rules.expand(rule, ops.var(ir.COTANGENT), ops.var(out_name or v), args,
                                    kernel=self.k.name, loc=s.loc)
            self._g = g or self.adj(v)
            if out_name:
                self.names.setdefault(out_name, out_name)
            for x, c in zip(e.args, contribs):
                if c is None or not a.active(x):
                    continue
                t = self.T[x.name]
                out.append((self.adj(x.name), self.cast(self.sym(ops._lift(c), t), t)))
        return out

    def consume(self, depth, ref, dtype):
        """A stored element's incoming adjoint, read, is consumed (API.md)."""
        self.emit(depth, f"{ref} = {self.zero(dtype)}")

    def accumulate(self, depth, target, op, text):
        """``target op text``: ``op`` is "=" (a single-use adjoint) or "+="; ``target``
        is an :class:`AdjRef` when it is an element of an adjoint array."""
        self.emit(depth, f"{target} {op} {text}")

    def _is_single_adj(self, target):
        """Is ``target`` the adjoint of a variable used once (assigned, not added to)?"""
        key = self.derived_of.get(target) if isinstance(target, str) else None
        return key is not None and key[0] == "adj" and key[1] in self.single_use

    def rev_store(self, s, depth):
        a = self.a
        arr = s.array.name
        if arr not in a.varied_arrays:
            return
        self.comment(depth, s.loc)
        ref = self.elem(self.adj(arr), [self.o(i) for i in s.index])
        if s.accumulate:  # an increment: the element's adjoint flows into the value
            if a.active(s.value):
                t = self.T[s.value.name]
                op = {"add": "+=", "sub": "-="}[s.accumulate]
                if s.value.name in self.single_use:
                    op = "=" if op == "+=" else "= -"
                self.emit(depth, f"{self.adj(s.value.name)} {op} {self.cast(ref, t)}")
            return
        if a.active(s.value):
            t = self.T[s.value.name]
            op = "=" if s.value.name in self.single_use else "+="
            self.emit(depth, f"{self.adj(s.value.name)} {op} {self.cast(ref, t)}")
        self.consume(depth, ref, self.T[arr].dtype)
        if arr in a.restore_arrays:
            fref = self.elem(self.arr(arr), [self.o(i) for i in s.index])
            self.pop(depth, fref, self.T[arr].dtype)

    def invariant_loads(self, loop):
        """Loads inside ``loop`` whose element does not change during it (index
        variables the loop does not assign, array the loop does not write): their
        adjoints are summed in a local and added to the array once, after the loop."""
        a = self.a
        assigned_in = ir.assigned(loop.body) | {loop.index}
        stored_in = ir.stored_arrays(loop.body)
        found = []
        for x in ir.walk(loop.body):
            if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                    x.target in a.varied:
                e = x.expr
                key = (e.array.name, tuple(e.index))
                if e.array.name in a.varied_arrays and e.array.name not in stored_in and \
                        not (ir.var_names(e.index) & assigned_in) and \
                        key not in self.accumulators and key not in found:
                    found.append(key)
        return found

    def open_accumulators(self, loop, depth):
        keys = self.invariant_loads(loop)
        for key in keys:
            name = self.fresh("acc_" + self.n(key[0]))
            self.accumulators[key] = name
            self.emit(depth, f"{name} = {self.zero(self.T[key[0]].dtype)}")
        return keys

    def close_accumulators(self, keys, depth):
        for key in keys:
            arr, index = key
            name = self.accumulators.pop(key)
            ref = AdjRef(self.elem(self.adj(arr), [self.o(i) for i in index]),
                         arr, index)
            self.accumulate(depth, ref, "+=", name)

    def rev_for(self, s, depth, loop_depth):
        keys = self.open_accumulators(s, depth)
        self._rev_for(s, depth, loop_depth)
        self.close_accumulators(keys, depth)

    def _rev_for(self, s, depth, loop_depth):
        a = self.a
        header_at = len(self.lines)
        idx = self.n(s.index)
        lo, hi, st = self.o(s.start), self.o(s.stop), self.o(s.step)
        self.comment(depth, s.loc)
        self.emit(depth, f"# reversed: for {idx} in range({lo}, {hi}, {st})")
        if self._counted(s):
            cnt = self._count_name(s)
            if loop_depth > 0:
                self.pop(depth, cnt, types.int64)
            k = self.fresh("k")
            self.emit(depth, f"for {k} in range({cnt} - 1, -1, -1):")
            self.emit(depth + 1, f"{idx} = {_add(lo, f'{k} * {st}' if st != '1' else k)}")
        elif s.uid in a.ascending:
            self.emit(depth, "# (iterations are independent: their adjoints run in forward "
                             "order)")
            self.emit(depth, f"for {idx} in range({lo}, {hi}, {st}):")
        elif st == "1":
            self.emit(depth, f"for {idx} in range({_add(hi, '-1')}, {_add(lo, '-1')}, -1):")
        elif st == "-1":
            self.emit(depth, f"for {idx} in range({_add(hi, '1')}, {_add(lo, '1')}):")
        else:
            k = self.fresh("k")
            self.emit(depth, f"for {k} in range(_trips({lo}, {hi}, {st}) - 1, -1, -1):")
            self.emit(depth + 1, f"{idx} = {lo} + {k} * {st}")
        if s.uid in a.replay:
            self.emit(depth + 1, "# replay this iteration's forward part, recording")
            hoist = {"assigned": ir.assigned(s.body) | {s.index}, "amounts": {}}
            self.open_frame(depth + 1, hoist=hoist, body=s.body)
            saved = (self.kept, self.skip_stores, self.nopush)
            self.kept = set(map(id, ir.walk(s.body)))
            self.skip_stores, self.nopush = True, False
            self._last_loc = None
            self.fwd(s.body, depth + 1, loop_depth + 1)
            self.kept, self.skip_stores, self.nopush = saved
            self.close_frame()
            self._last_loc = None
            saved_kept = self.kept
            self.kept = set(map(id, ir.walk(s.body)))  # what the replay recorded
            self.rev(s.body, depth + 1, loop_depth + 1, frozenset())
            self.kept = saved_kept
            if id(s) in self.kept:  # the forward sweep saved these before the loop
                for v in reversed(a.replay[s.uid]):
                    self.pop(depth, self.n(v), self.T[v])
            if hoist["amounts"]:
                amounts = {k: " + ".join(v) for k, v in hoist["amounts"].items()}
                self.lines[header_at:header_at] = self._reserve_lines(amounts, depth)
            return
        rec = a.recompute.get(s.uid, ())
        recomputed = a.recompute_vars.get(s.uid, set())
        needed_rec = self._needed_recompute(rec, s)
        if needed_rec:
            self.emit(depth + 1, "# recompute")
            self.recompute(needed_rec, depth + 1)
        saved_vars = a.loop_saved.get(s.uid, ())
        saved = self.suppressed
        self.suppressed = self.suppressed | set(saved_vars)
        self.rev(s.body, depth + 1, loop_depth + 1, frozenset(recomputed))
        self.suppressed = saved
        if id(s) in self.kept:
            self.pop_loop_saves(s, depth)

    def needs_reverse(self, s):
        """Does statement ``s`` have reverse code or values to pop?"""
        a = self.a
        if a.has_rev.get(id(s)):
            return True
        if isinstance(s, ir.Assign):
            return (s.target in a.pushed and id(s) in self.kept and
                    s.target not in self.suppressed and id(s) not in a.replay_fresh)
        if isinstance(s, ir.If):
            return any(self.needs_reverse(x) for x in s.then + s.orelse)
        if isinstance(s, (ir.ForRange, ir.Loop)):
            return id(s) in self.kept and (
                s.uid in a.loop_saved or
                (isinstance(s, ir.ForRange) and s.uid in a.index_saved))
        return False

    def pop_loop_saves(self, s, depth):
        """Restore what the forward sweep saved before a loop without reverse code."""
        if self.nopush:
            return
        for v in reversed(self.a.loop_saved.get(s.uid, ())):
            self.pop(depth, self.n(v), self.T[v])
        if isinstance(s, ir.ForRange) and s.uid in self.a.index_saved:
            self.pop(depth, self.n(s.index), self.T[s.index])

    def _needed_recompute(self, rec, loop):
        """The recomputable statements whose values the reversed body reads."""
        reads = set()
        for x in ir.walk(loop.body):
            if not self.a.has_rev.get(id(x)):
                continue
            if isinstance(x, ir.Assign) and x.target in self.a.varied:
                reads |= partial_reads(x, self.a)
            elif isinstance(x, ir.Store):
                reads |= ir.var_names(x.index)
            elif isinstance(x, ir.If):
                reads |= ir.var_names((x.cond,))
            elif isinstance(x, ir.ForRange):
                reads |= ir.var_names((x.start, x.stop, x.step))
        for x in ir.walk(loop.body):
            if isinstance(x, ir.ForRange):
                for r in ir.walk(self.a.recompute.get(x.uid, ())):
                    reads |= ir.stmt_reads(r)
        keep = []
        for x in reversed(rec):
            defs = {y.target for y in ir.walk((x,)) if isinstance(y, ir.Assign)}
            if defs & reads:
                keep.append(x)
                for y in ir.walk((x,)):
                    reads |= ir.stmt_reads(y)
        return list(reversed(keep))

    def recompute(self, stmts, depth):
        for s in stmts:
            if isinstance(s, ir.Assign):
                self.emit(depth, f"{self.n(s.target)} = {self.expr(s.expr)}")
            elif isinstance(s, ir.If):
                if not s.then:
                    self.emit(depth, f"if not {self.o(s.cond)}:")
                    self.recompute(s.orelse, depth + 1)
                    continue
                self.emit(depth, f"if {self.o(s.cond)}:")
                self.recompute(s.then, depth + 1)
                if s.orelse:
                    self.emit(depth, "else:")
                    self.recompute(s.orelse, depth + 1)

    def rev_loop(self, s, depth, loop_depth):
        cnt = self._count_name(s)
        self.comment(depth, s.loc)
        self.emit(depth, "# reversed: while loop, replayed for its recorded trip count")
        if loop_depth > 0:
            self.pop(depth, cnt, types.int64)
        k = self.fresh("k")
        self.emit(depth, f"for {k} in range({cnt}):")
        saved_vars = self.a.loop_saved.get(s.uid, ())
        saved = self.suppressed
        self.suppressed = self.suppressed | set(saved_vars)
        self.rev(s.body, depth + 1, loop_depth + 1)
        self.suppressed = saved
        if id(s) in self.kept:
            self.pop_loop_saves(s, depth)


def _add(a, b):
    """Render a + b with small constant folding."""
    try:
        return str(int(a) + int(b))
    except ValueError:
        pass
    if b.startswith("-"):
        return f"{a} - {b[1:]}"
    return f"{a} + {b}"


def _strip(text):
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text


def _source_line(loc):
    import linecache
    line = linecache.getline(loc.filename, loc.line).strip()
    return line


def _push_impl():
    from .runtime_helpers import _push
    return _push


def _sign_impl():
    from .runtime_helpers import _sign
    return _sign


def write_adjoint(kernel, an, slot_args, returns_value):
    fname = f"{kernel.name}_adjoint"
    w = Writer(kernel, an, slot_args, returns_value, fname)
    source, params = w.write()
    return AdjointSource(name=fname, source=source, namespace=w.ns, param_names=params)
