"""Public API: :func:`differentiate`, the differentiated-kernel object, :func:`grad`,
:func:`value_and_grad` and :func:`register_adjoint`.

A :class:`DifferentiatedKernel` wraps a numba dispatcher.  Calling it runs the forward
exactly as the undecorated kernel (recorded on an active :class:`kadj.Tape`);
``.adjoint(...)`` runs the generated adjoint, compiled once per argument-type
signature by the pipeline frontend -> structurize -> analysis -> reverse -> codegen.
"""
from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass

import numpy as np
from numba.core import types
from numba.core.errors import NumbaError

from . import analysis, codegen, frontend, ir, reverse, rules, structurize, validate
from .errors import DifferentiationError
from .plan import AdjointPlan

_JIT_OPTIONS_KEPT = ("fastmath", "error_model", "boundscheck", "nogil")


@dataclass(frozen=True)
class CompiledAdjoint:
    plan: AdjointPlan
    source: str
    function: object       # the jitted adjoint
    disk_cached: bool


def _is_float_type(t):
    return isinstance(t, types.Float) or (isinstance(t, types.Array) and
                                          isinstance(t.dtype, types.Float))


class DifferentiatedKernel:
    """A numba ``@njit`` kernel together with its generated adjoint.

    Example::

        @kadj.differentiate
        @njit
        def heat_step(u, u_new, alpha):
            for i in range(1, u.shape[0] - 1):
                u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])

        heat_step(u, u_new, 0.1)                                   # forward
        heat_step.adjoint(u, u_new, 0.1, adj_u, adj_u_new, adj_alpha)
    """

    def __init__(self, dispatcher, wrt=None):
        if not frontend.is_jitted(dispatcher):
            raise TypeError(
                "kadj.differentiate expects a numba @njit or @cuda.jit function; "
                f"got {dispatcher!r}. Put @kadj.differentiate above the numba decorator.")
        self.dispatcher = dispatcher
        self.py_func = dispatcher.py_func
        self.__name__ = self.py_func.__name__
        self.__doc__ = self.py_func.__doc__
        self.__wrapped__ = self.py_func
        self.wrt = tuple(wrt) if wrt is not None else None
        code = self.py_func.__code__
        self.arg_names = tuple(code.co_varnames[:code.co_argcount])
        if self.wrt is not None:
            unknown = [w for w in self.wrt if w not in self.arg_names]
            if unknown:
                raise ValueError(f"wrt names {unknown} are not arguments of "
                                 f"{self.__name__}{self.arg_names}")
        self._cache = {}
        self._fast = {}
        self._lock = threading.Lock()
        self._last = None
        self._rules_seen = rules.generation()

    def __repr__(self):
        return f"<kadj differentiated kernel {self.__name__}>"

    # ---- forward ------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        from . import tape as _tape
        if kwargs:
            args = self.complete_args(args, kwargs)
        t = _tape.active()
        if t is not None:
            return t.record(self, self.complete_args(args))
        _tape.check_unrecorded(self, args)
        try:
            return self.dispatcher(*args)
        except (NumbaError, NotImplementedError) as exc:
            _raise_clearer(self.__name__, self.arg_names, args, exc)
            raise

    def complete_args(self, args, kwargs=None):
        """``args`` (and keyword arguments) as one positional tuple, omitted trailing
        arguments filled from the defaults."""
        if not kwargs and len(args) == len(self.arg_names):
            return tuple(args)
        return validate.bind(self.__name__, self.arg_names, self.py_func.__defaults__ or (),
                             tuple(args), kwargs or {})

    def forward(self, *args):
        """Run the forward kernel without recording it on a tape."""
        return self.dispatcher(*args)

    # ---- compilation -----------------------------------------------------------------
    def _arg_types(self, args):
        if len(args) != len(self.arg_names):
            raise TypeError(f"{self.__name__} takes {len(self.arg_names)} arguments "
                            f"{self.arg_names}, got {len(args)}")
        validate.check_arguments(self.__name__, self.arg_names, args)
        arg_types = tuple(self.dispatcher.typeof_pyval(a) for a in args)
        for name, a, t in zip(self.arg_names, args, arg_types):
            if t == types.pyobject:
                raise validate.unsupported_type(self.__name__, name, a)
        return arg_types

    def _options(self):
        opts = getattr(self.dispatcher, "targetoptions", {}) or {}
        kept = {k: opts[k] for k in _JIT_OPTIONS_KEPT if k in opts}
        # IEEE arithmetic: a singular partial (sqrt at 0) gives inf/nan, never an exception
        kept["error_model"] = "numpy"
        return kept

    def compiled(self, *args):
        """The compiled adjoint for these arguments' types."""
        args = self.complete_args(args)
        if self._rules_seen != rules.generation():
            self._forget_adjoints()
        fast = _fast_key(args)
        hit = self._fast.get(fast) if fast is not None else None
        if hit is not None:
            self._last = hit
            return hit
        try:
            hit = self._compiled_slow(args)
        except NumbaError as exc:
            _raise_clearer(self.__name__, self.arg_names, args, exc)
            raise
        if fast is not None:
            self._fast[fast] = hit
        return hit

    def _forget_adjoints(self):
        """Drop the adjoints built under an older rule table (a rule registered or
        replaced since): they are rebuilt, with the new rule, when next needed."""
        with self._lock:
            self._rules_seen = rules.generation()
            self._cache, self._fast = {}, {}

    def _compiled_slow(self, args):
        arg_types = self._arg_types(args)
        hit = self._cache.get(arg_types)
        if hit is not None:
            self._last = hit
            return hit
        with self._lock:
            hit = self._cache.get(arg_types)
            if hit is None:
                hit = self._build(arg_types)
                self._cache[arg_types] = hit
        self._last = hit
        return hit

    def _build(self, arg_types):
        options = self._options()
        key = codegen.cache_key(self.py_func, arg_types, self.wrt, options, "cpu")
        cached = codegen.load_cached(key)
        if cached is not None:
            plan, source, pyfn, _report = cached
            return CompiledAdjoint(plan, source, *codegen.jit(pyfn, True, options))
        tk = frontend.type_cpu_kernel(self.dispatcher, arg_types)
        kernel = structurize.structurize(tk)
        plan = self._plan(kernel, arg_types)
        slot_names = tuple(self.arg_names[i] for i in plan.adjoint_args)
        an = analysis.analyze(kernel, slot_names, plan.returns_value)
        adj = reverse.write_adjoint(kernel, an, slot_names, plan.returns_value)
        files = {loc.filename for loc in _locs(tk.func_ir) if loc.filename}
        pyfn, disk = codegen.build(adj, plan, key, files, func_ir=tk.func_ir)
        return CompiledAdjoint(plan, adj.source, *codegen.jit(pyfn, disk, options))

    def _plan(self, kernel, arg_types):
        stored = ir.stored_arrays(kernel.body)
        loaded = ir.loaded_arrays(kernel.body)
        slots, written, read = [], set(), set()
        for i, (name, t) in enumerate(zip(self.arg_names, arg_types)):
            is_arr = isinstance(t, types.Array)
            if is_arr and name in stored:
                written.add(i)
            if is_arr and name in loaded:
                read.add(i)
            if not _is_float_type(t):
                if self.wrt is not None and name in self.wrt:
                    raise DifferentiationError(
                        f"argument '{name}' has type {t}, which is not floating point",
                        kernel=self.__name__, construct=f"wrt={self.wrt}",
                        remedy="only float32/float64 arguments can be differentiated")
                continue
            if isinstance(t, types.Array) and t.dtype != t.dtype or \
                    isinstance(getattr(t, "dtype", None), types.Complex):
                continue
            if self.wrt is None or name in self.wrt or (is_arr and name in stored):
                slots.append(i)
        returns = isinstance(kernel.return_type, types.Float)
        if isinstance(kernel.return_type, types.BaseTuple) and any(
                isinstance(t, (types.Float, types.Complex)) for t in kernel.return_type):
            raise DifferentiationError(
                f"it returns a tuple ({kernel.return_type}); only a single float return "
                "value carries a gradient", kernel=self.__name__, construct="tuple return",
                remedy="return one float (the loss) and write other results into output "
                       "arrays")
        if isinstance(kernel.return_type, types.Complex):
            raise DifferentiationError("complex return values are not supported yet",
                                       kernel=self.__name__, construct="complex return")
        return AdjointPlan(kernel_name=self.__name__, arg_names=self.arg_names,
                           adjoint_args=tuple(slots), written=frozenset(written),
                           read=frozenset(read), returns_value=returns)

    # ---- adjoint ------------------------------------------------------------------
    def adjoint_plan(self, *args):
        """The :class:`~kadj.plan.AdjointPlan` (argument layout) for these arguments."""
        return self.compiled(*args).plan

    def adjoint_source(self, *example_args):
        """The generated adjoint as Python source text."""
        if example_args:
            return self.compiled(*example_args).source
        if self._last is None:
            raise DifferentiationError(
                "adjoint_source() needs example arguments until the adjoint has been "
                "compiled once", kernel=self.__name__,
                remedy=f"call {self.__name__}.adjoint_source(*args) with example arguments")
        return self._last.source

    def adjoint(self, *args, adj_return=1.0, **kwargs):
        """Run the adjoint: ``k.adjoint(*forward_args, *adjoints, adj_return=1.0)``.

        Adjoints are in/out (API.md): on entry the cotangent of each argument's state
        after the call, on return the cotangent of its state before the call.  Returns
        the forward's return value (recomputed), if any.  Arguments may also be passed
        by keyword: forward ones by name, adjoints as ``adj_<name>=``.
        """
        call = f"{self.__name__}.adjoint"
        fwd, adjs, by_name = validate.split_adjoint_call(
            call, self.arg_names, self.py_func.__defaults__ or (), args, kwargs)
        comp = self.compiled(*fwd)
        plan = comp.plan
        adjs = validate.order_adjoints(call, plan, fwd, adjs, by_name)
        validate.check_adjoint_call(call, plan, fwd, adjs, host=True)
        call_args = list(fwd) + list(adjs)
        if plan.returns_value:
            call_args.append(float(adj_return))
        try:
            return comp.function(*call_args)
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            if not comp.disk_cached or isinstance(exc, ValueError) and \
                    "pickle" not in str(exc):
                raise
            # numba's on-disk cache of this adjoint is damaged: compile without it
            return self._uncached(comp)(*call_args)

    def _uncached(self, comp):
        fresh = CompiledAdjoint(comp.plan, comp.source,
                                *codegen.jit(comp.function.py_func, False, self._options()))
        self._cache = {k: (fresh if v is comp else v) for k, v in self._cache.items()}
        self._fast = {k: (fresh if v is comp else v) for k, v in self._fast.items()}
        self._last = fresh
        return fresh.function


def _fast_key(args):
    """A cheap key that determines numba's argument types (dtype, ndim, layout,
    writability for arrays; the Python type for scalars), or None."""
    key = []
    for a in args:
        if isinstance(a, np.ndarray):
            f = a.flags
            key.append((a.dtype.str, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable,
                        f.aligned, type(a) is np.ndarray))
        elif isinstance(a, (float, int, bool, np.floating, np.integer, np.bool_)):
            key.append(type(a))
        else:
            return None
    return tuple(key)


def _raise_clearer(call, names, args, exc):
    """Raise a clear error (kernel, argument, what to do) in place of numba's ``exc``
    when an argument explains it; return otherwise."""
    clear = validate.explain_failure(call, names, args, exc)
    if clear is not None:
        raise clear from exc


def _locs(func_ir):
    for blk in func_ir.blocks.values():
        for s in blk.body:
            if getattr(s, "loc", None) is not None:
                yield s.loc


# ---- decorators and functional API ---------------------------------------------------
def differentiate(kernel=None, wrt=None, checkpoints=None, gather=True):
    """Differentiate a numba kernel: ``@kadj.differentiate`` above ``@njit`` or
    ``@cuda.jit``.

    Also usable as ``kadj.differentiate(kernel, wrt=("u", "alpha"))`` and as
    ``@kadj.differentiate(wrt=(...))``.  ``checkpoints`` (CUDA kernels): the number of
    per-thread checkpoint slots for loops that carry state (default 24): reversing
    such a loop of n iterations replays O(log n) forward iterations per reversed one
    while n <= 2**checkpoints, in bounded per-thread memory.  ``gather`` (CUDA
    stencils): use the gather form of the adjoint (no atomics on neighbour arrays) when
    the launch allows it.
    """
    if kernel is None:
        return lambda k: differentiate(k, wrt=wrt, checkpoints=checkpoints, gather=gather)
    if isinstance(kernel, DifferentiatedKernel):
        if wrt is None or tuple(wrt) == kernel.wrt:
            return kernel
        kernel = kernel.dispatcher
    if _is_cuda(kernel):
        from .cuda_api import CudaDifferentiatedKernel
        return CudaDifferentiatedKernel(kernel, wrt=wrt, checkpoints=checkpoints,
                                        gather=gather)
    return DifferentiatedKernel(kernel, wrt=wrt)


def _is_cuda(kernel):
    mod = type(kernel).__module__
    return "cuda" in mod


def register_adjoint(fn):
    """Register a derivative rule for ``fn`` (a jitted helper or any callable numba can
    compile), written in :mod:`kadj.ops`::

        @kadj.register_adjoint(my_softplus)
        def _(g, out, x):
            return (g * (1.0 - kadj.ops.exp(-out)),)

    The rule gets the incoming adjoint ``g``, the primal output ``out`` and the
    arguments, and returns one contribution per argument (``None`` for none).  A rule
    whose parameters cannot take ``fn``'s arguments is refused here, one returning the
    wrong number of contributions when a kernel first uses it.  Registering again
    replaces the rule, also in the adjoints of kernels already differentiated (they
    are rebuilt).
    """
    def deco(vjp):
        rules.register(fn, domain=(), name=getattr(fn, "__name__", "custom"),
                       arities=rules.arities_of(fn))(vjp)
        rules.CUSTOM[fn] = vjp
        return vjp
    return deco


def _as_kernel(f):
    if isinstance(f, DifferentiatedKernel):
        return f
    return differentiate(f)


def value_and_grad(f, argnums=0):
    """``value_and_grad(f, argnums)(*args) -> (f(*args), gradient(s))`` for an ``@njit``
    function returning a float (like ``jax.value_and_grad``)."""
    k = _as_kernel(f)
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def run(*args, **kwargs):
        nargs = len(k.arg_names)
        for i in nums:
            if not -nargs <= i < nargs:
                raise IndexError(f"argnums {i} is out of range for {k.__name__}, which "
                                 f"takes {nargs} arguments")
        idx = tuple(i % nargs for i in nums)
        args = k.complete_args(args, kwargs)   # defaults filled before the buffers
        comp = k.compiled(*args)
        plan = comp.plan
        if not plan.returns_value:
            raise DifferentiationError(
                f"{k.__name__} does not return a float, so it has no gradient",
                kernel=k.__name__, remedy="return the scalar loss from the function")
        for i in idx:
            if i not in plan.adjoint_args:
                raise DifferentiationError(
                    f"argument {i} ('{k.arg_names[i]}') is not differentiable (not a float "
                    "or not in wrt)", kernel=k.__name__)
        bufs = []
        for i in plan.adjoint_args:
            x = args[i]
            if isinstance(x, np.ndarray):
                bufs.append(np.zeros_like(x))
            else:
                bufs.append(np.zeros(1, dtype=np.asarray(x).dtype))
        value = k.adjoint(*args, *bufs, adj_return=1.0)
        grads = []
        for i in idx:
            b = bufs[plan.adjoint_args.index(i)]
            grads.append(b if isinstance(args[i], np.ndarray) else b[0].item())
        return value, (grads[0] if single else tuple(grads))

    return run


def grad(f, argnums=0):
    """``grad(f, argnums)(*args)``: gradient of an ``@njit`` function returning a float
    with respect to ``args[argnums]`` (a tuple of gradients for a tuple of argnums)."""
    vg = value_and_grad(f, argnums)

    def run(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    return run
