"""The differentiated-kernel object, common to every target.

A :class:`DifferentiatedKernel` wraps a numba dispatcher and its target's description
(:mod:`kadj.targets`).  It binds arguments (keywords, defaults), checks them
(:mod:`kadj.validate`), runs or records the forward on an active :class:`kadj.Tape`,
and keeps the compiled adjoints: one per argument-type signature, found first by a cheap
key of the arguments, built by :func:`kadj.pipeline.compile` (disk cache, then the
stages), and rebuilt when a derivative rule is registered or replaced.  A device
target's kernel object subclasses it for its launch syntax, its compiled code (PTX,
resources) and its adjoint report only.
"""
from __future__ import annotations

import dataclasses
import pickle
import threading

import numpy as np
from numba.core import types
from numba.core.errors import NumbaError

from . import arrays, call_cache, codegen, pipeline, progress, rules, tape_threads, targets, \
    typing_memo, validate
from .compiling import compiling
from .errors import DifferentiationError
from .frozen_globals import FrozenGlobals


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

    target_name = "cpu"
    _expects = ("kadj.differentiate expects a numba @njit or @cuda.jit function; got {!r}. "
                "Put @kadj.differentiate above the numba decorator.")

    def __init__(self, dispatcher, wrt=None, **options):
        self.target = targets.get(self.target_name)
        if not self.target.recognises(dispatcher):
            other = targets.for_dispatcher(dispatcher)
            if other is not None:
                raise TypeError(f"{dispatcher!r} is a {other.title} kernel, not a "
                                f"{self.target.title} one: differentiate it with "
                                "kadj.differentiate")
            raise TypeError(self._expects.format(dispatcher))
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
        self.options = pipeline.resolve_options(self.target, self.__name__, options)
        self._cache = {}
        self._fast = {}
        self._calls = {}        # adjoint calls: call_cache.signature -> CallFacts
        self._lock = threading.Lock()
        self._last = None
        self._rules_seen = rules.generation()
        # the globals the forward was compiled with (numba freezes them; CPU kernels)
        self._frozen = FrozenGlobals(self) if self.target.name == "cpu" else None

    def __repr__(self):
        return f"<kadj differentiated kernel {self.__name__}>"

    # ---- forward ------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self.complete_args(args, kwargs)
        if tape_threads.entered or tape_threads.active() is not None:
            return self._forward(args, lambda: self._dispatch(args))
        try:                            # no tape anywhere: nothing to record or check
            return self._dispatch(args)
        except (NumbaError, NotImplementedError) as exc:
            raise_clearer(self.__name__, self.arg_names, args, exc)
            raise

    def _forward(self, args, run, config=None):
        """Record the forward on the active tape, or ``run()`` it."""
        t = tape_threads.active()
        if t is not None:
            if config is None:
                return t.record(self, self.complete_args(args))
            return t.record(self, args, config=config)
        tape_threads.check_unrecorded(self, args)
        try:
            return run()
        except (NumbaError, NotImplementedError) as exc:
            raise_clearer(self.__name__, self.arg_names, args, exc)
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
        return self._dispatch(args)

    def _dispatch(self, args):
        """The numba dispatcher's call; a signature it compiled on the way has its
        globals noted (:mod:`kadj.frozen_globals`)."""
        d = self.dispatcher
        if self._frozen is None:
            return d(*args)
        n = len(d.overloads)
        result = d(*args)
        if len(d.overloads) != n:
            self._frozen.after_forward()
        return result

    def raise_as_forward(self, plan, args):
        """Run the forward on copies of the array arguments when the kernel has a
        ``raise`` (or ``assert``) that the generated code leaves out
        (``plan.forward_raises``): jvp and the transforms of functions, which run no
        forward of their own, then raise where the forward would, before any argument
        changes."""
        if plan.forward_raises:
            self.dispatcher(*[np.copy(a) if isinstance(a, np.ndarray) else a
                              for a in args])

    def recompile(self):
        """Compile the forward again, for every signature numba has compiled, with the
        current values of the globals the kernel reads (numba froze them at the first
        compilation), and drop the adjoints: they are built again, with the same
        values, when next needed."""
        self.dispatcher.recompile()
        if self._frozen is not None:
            self._frozen.forget()
            self._frozen.after_forward()
        self._forget_adjoints()

    # ---- compilation -----------------------------------------------------------------
    def _arg_types(self, args):
        if len(args) != len(self.arg_names):
            raise TypeError(f"{self.__name__} takes {len(self.arg_names)} arguments "
                            f"{self.arg_names}, got {len(args)}")
        validate.check_arguments(self.__name__, self.arg_names, args)
        arg_types = []
        for name, a in zip(self.arg_names, args):
            try:
                t = self.target.typeof(self.dispatcher, a)
            except (ValueError, TypeError):
                t = types.pyobject
            if t == types.pyobject:
                raise validate.unsupported_type(self.__name__, name, a)
            arg_types.append(t)
        return tuple(arg_types)

    def _options(self):
        """The compiler options of the kernel that its adjoint is compiled with."""
        return self.target.jit_options(self.dispatcher)

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
            raise_clearer(self.__name__, self.arg_names, args, exc)
            raise
        if fast is not None:
            self._fast[fast] = hit
        return hit

    def _forget_adjoints(self):
        """Drop the adjoints built under an older rule table (a rule registered or
        replaced since): they are rebuilt, with the new rule, when next needed."""
        with self._lock:
            self._rules_seen = rules.generation()
            self._cache, self._fast, self._calls = {}, {}, {}

    def _compiled_slow(self, args):
        arg_types = self._arg_types(args)
        hit = self._cache.get(arg_types)
        if hit is not None:
            self._last = hit
            return hit
        with self._lock:
            hit = self._cache.get(arg_types)
            if hit is None:
                if self._frozen is not None:
                    self._frozen.before_build(arg_types)
                hit = self._build(arg_types)
                self._cache[arg_types] = hit
        self._last = hit
        return hit

    def request(self, arg_types):
        """What the pipeline builds for these argument types."""
        return pipeline.request(self.target, self.dispatcher, arg_types, self.wrt,
                                self.options, self._options())

    def _build(self, arg_types):
        with progress.notice(f"generating the adjoint of {progress.where(self.dispatcher)}"), \
                typing_memo.memoised():
            return pipeline.compile(self.target, self.request(arg_types))

    def _run(self, comp, call_args):
        """``comp.function(*call_args)``, with the memory it keeps between calls
        (:mod:`kadj.call_memory`); a first call, which numba compiles (or loads from its
        cache), says so when it takes a while (:mod:`kadj.progress`)."""
        pool = getattr(comp, "memory", None)
        if pool is None:
            return self._call(comp.function, call_args)
        kept = pool.take()
        try:
            return self._call(comp.function, (*call_args, *kept.args))
        finally:
            pool.give(kept)

    def _call(self, fn, call_args):
        if getattr(fn, "overloads", True):      # compiled already (numba's own dict)
            return fn(*call_args)
        with progress.notice(f"compiling the adjoint of {progress.where(self.dispatcher)}"), \
                compiling():
            try:    # (compiled here, so that the notice times the compilation alone)
                fn.compile(tuple(fn.typeof_pyval(a) for a in call_args))
            except Exception:   # the call compiles it, and raises what it raises
                pass
        with compiling():
            return fn(*call_args)

    def stages(self, *args, until="compiled"):
        """Every pipeline stage's output for these arguments, up to ``until``
        (:func:`kadj.pipeline.stages`); nothing cached."""
        args = self.complete_args(args)
        return pipeline.stages(self.target, self.request(self._arg_types(args)), None,
                               until=until)

    def show_stage(self, stage, *args):
        """The text of one pipeline stage's output for these arguments
        (:func:`kadj.pipeline.show`; ``python -m kadj show --stage``)."""
        args = self.complete_args(args)
        return pipeline.show(self.target, self.request(self._arg_types(args)), None, stage)

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

    def _adjoint_call(self, args, kwargs, config=None):
        """(compiled adjoint, forward arguments, adjoints) of an adjoint call, checked
        (``config``: the launch configuration of a device adjoint)."""
        call = f"{self.__name__}.adjoint"
        defaults = self.py_func.__defaults__ or ()
        fwd, adjs, by_name = validate.split_adjoint_call(
            call, self.arg_names, defaults, args, kwargs or {})
        try:
            comp = self.compiled(*fwd)
        except (NumbaError, DifferentiationError) as exc:
            validate.blame_omitted_default(call, self.arg_names, defaults, args, kwargs,
                                           exc)
            raise
        if config is not None:
            self.check_adjoint_launch(call, config, comp)
        try:
            adjs = validate.order_adjoints(call, comp.plan, fwd, adjs, by_name)
        except TypeError as exc:
            validate.blame_omitted_default(call, self.arg_names, defaults, args, kwargs,
                                           exc)
            raise
        if config is None:
            validate.check_adjoint_call(call, comp.plan, fwd, adjs, host=True)
        else:
            validate.check_adjoint_call(call, comp.plan, fwd, adjs)
            validate.check_transferable(call, self.arg_names + comp.plan.adjoint_names(),
                                        fwd + adjs)
        return comp, fwd, adjs

    def check_adjoint_launch(self, call, config, comp):
        """Refuse an adjoint launch ``config`` the kernel cannot run (device targets)."""

    def adjoint(self, *args, adj_return=validate.DEFAULT_ADJ_RETURN, **kwargs):
        """Run the adjoint: ``k.adjoint(*forward_args, *adjoints, adj_return=1.0)``.

        Adjoints are in/out (API.md): on entry the cotangent of each argument's state
        after the call, on return the cotangent of its state before the call.  Returns
        the forward's return value (recomputed), if any.  Arguments may also be passed
        by keyword: forward ones by name, adjoints as ``adj_<name>=``.

        The argument checks run in full on the first call of each argument signature;
        a repeated positional call tests only what the values decide
        (:mod:`kadj.call_cache`), and anything doubtful gets the full checks.
        """
        comp = None
        if not kwargs and self._rules_seen == rules.generation():
            key = call_cache.signature(args)
            facts = self._calls.get(key) if key is not None else None
            if facts is not None and facts.accepts(args):
                comp = self._last = facts.comp
                call_args = args
        if comp is None:
            comp, fwd, adjs = self._adjoint_call(args, kwargs)
            call_args = fwd + adjs
            if not kwargs and self._rules_seen == rules.generation():
                key = call_cache.signature(args)
                if key is not None:
                    call_cache.remember(self._calls, key, comp, args)
        if comp.plan.returns_value:
            call_args = (*call_args, validate.adj_return_value(
                f"{self.__name__}.adjoint", self.__name__, True, adj_return))
        elif adj_return is not validate.DEFAULT_ADJ_RETURN:
            validate.adj_return_value(f"{self.__name__}.adjoint", self.__name__, False,
                                      adj_return)
        try:
            return self._run(comp, call_args)
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            if not comp.disk_cached or isinstance(exc, ValueError) and \
                    "pickle" not in str(exc):
                raise
            # numba's on-disk cache of this adjoint is damaged: compile without it
            return self._run(self._uncached(comp), call_args)

    def adjoint_trusted(self, plan, args, adjoints):
        """Run the adjoint on NumPy adjoint buffers a :class:`~kadj.Tape` made for a
        launch it recorded with ``plan`` (their shapes, dtypes and separation hold by
        construction, so ``adjoint``'s argument checks are skipped); returns False,
        having run nothing, when the call needs those checks (device arrays, a written
        argument whose elements share memory, a changed plan, a damaged disk cache)."""
        for a in args:
            if type(a) is not np.ndarray and arrays.is_array(a):
                return False
        for b in adjoints:
            if type(b) is not np.ndarray:
                return False
        for i in plan.written:
            if arrays.self_overlapping(args[i]):
                return False                 # refused by adjoint()'s checks
        comp = self.compiled(*args)
        if comp.plan is not plan and comp.plan != plan:
            return False
        call = (*args, *adjoints, 0.0) if plan.returns_value else (*args, *adjoints)
        try:
            self._run(comp, call)
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            if not comp.disk_cached or isinstance(exc, ValueError) and \
                    "pickle" not in str(exc):
                raise
            return False   # a damaged disk cache: adjoint() compiles without it
        return True

    # ---- forward mode ---------------------------------------------------------------
    def jvp(self, *args, **kwargs):
        """Forward mode: ``k.jvp(*forward_args, *tangents)`` (:mod:`kadj.jvp_call`).  Runs
        the forward and updates each tangent (the adjoint's slots, ``dot_<name>=`` by
        keyword) in place, from the pre-call state's tangent to the post-call state's;
        a kernel returning a float returns ``(value, tangent)``."""
        from . import jvp_call
        return jvp_call.run(self, args, kwargs)

    def jvp_source(self, *example_args):
        """The generated tangent (forward-mode) function as Python source text."""
        from . import jvp_call
        return jvp_call.source(self, example_args)

    def _uncached(self, comp):
        fresh = dataclasses.replace(
            comp, function=codegen.jit(comp.function.py_func, False, self._options())[0],
            disk_cached=False)
        self._cache = {k: (fresh if v is comp else v) for k, v in self._cache.items()}
        self._fast = {k: (fresh if v is comp else v) for k, v in self._fast.items()}
        self._calls = {}
        self._last = fresh
        return fresh


def _fast_key(args):
    """A cheap key that determines numba's argument types (dtype, ndim, layout,
    writability for arrays; the Python type for scalars), or None."""
    key = []
    for a in args:
        if isinstance(a, np.ndarray):   # flags.num: contiguity, writeable, aligned, ...
            key.append((type(a), a.dtype, a.ndim, a.flags.num))
        elif isinstance(a, (float, int, bool, np.floating, np.integer, np.bool_)):
            key.append(type(a))
        else:
            return None
    return tuple(key)


def raise_clearer(call, names, args, exc):
    """Raise a clear error (kernel, argument, what to do) in place of numba's ``exc``
    when an argument explains it; return otherwise."""
    clear = validate.explain_failure(call, names, args, exc)
    if clear is not None:
        raise clear from exc
