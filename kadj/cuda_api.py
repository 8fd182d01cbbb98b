"""The differentiated CUDA kernel: ``@kadj.differentiate`` above ``@cuda.jit``.

::

    k[blocks, threads](u, u_new, alpha)                                # forward
    k.adjoint[blocks, threads](u, u_new, alpha, adj_u, adj_u_new, adj_alpha)
    k.adjoint_source(u, u_new, alpha)       # the generated adjoint kernel (Python)
    k.adjoint_plan(u, u_new, alpha)         # AdjointPlan, as for CPU kernels
    k.adjoint_ptx(u, u_new, alpha, cc=(9, 0))   # PTX of the adjoint (no GPU needed)
    k.adjoint_report(u, u_new, alpha)       # accumulation decisions (atomics, plain)
    k.jvp[blocks, threads](u, u_new, alpha, dot_u, dot_u_new, dot_alpha)   # forward mode
    k.jvp_source(u, u_new, alpha)           # the generated tangent kernel (Python)
    k.jvp_ptx(u, u_new, alpha, cc=(9, 0))   # PTX of the tangent kernel

Everything else (argument binding and checks, the compiled adjoints and their caches,
the pipeline, the disk cache) is the common kernel object's
(:class:`kadj.kernel.DifferentiatedKernel`) with the CUDA target's description
(:mod:`kadj.targets.cuda`).  Under the simulator the adjoint runs in the simulator like
any kernel (where a block's threads run one after another, so a missing atomic goes
unnoticed: check :meth:`adjoint_ptx`).
"""
from __future__ import annotations

from numba.core import types

from . import rules, validate
from .compiling import compiling
from .cuda import call_facts
from .cuda.atomic_extrema import winners
from .cuda.own_rows import buffers
from .cuda.slots import launch as launch_gather
from .cuda.frontend import simulator_enabled
from .errors import DifferentiationError
from .kernel import DifferentiatedKernel
from .targets.cuda import CompiledCudaAdjoint  # noqa: F401  (re-exported)


class _Launcher:
    def __init__(self, fn, config):
        self.fn, self.config = fn, config

    def __call__(self, *args, **kwargs):
        return self.fn(self.config, args, kwargs)


def _launcher(cache, name, config, fn):
    """The :class:`_Launcher` of ``fn`` for ``config``, the configuration checked
    (:func:`kadj.validate.check_launch`, which formats the call's text: about 10 us)
    only the first time; ``cache`` keeps the launchers of hashable configurations.  An
    invalid configuration is refused at every launch."""
    try:
        launcher = cache.get(config)
    except TypeError:           # lists in the configuration: checked every time
        validate.check_launch(name, config)
        return _Launcher(fn, config)
    if launcher is None:
        validate.check_launch(name, config)
        launcher = _Launcher(fn, config)
        if len(cache) >= 64:
            cache.clear()
        cache[config] = launcher
    return launcher


class _AdjointProxy:
    what, slots = "adjoint", "adjoints"

    def __init__(self, owner):
        self.owner = owner
        self.name = f"{owner.__name__}.{self.what}"     # as refusals name the launch
        self._launchers = {}    # checked launch configurations -> their launcher

    def run(self, config, args, kwargs):
        return self.owner._run_adjoint(config, args, kwargs)

    def __getitem__(self, config):
        return _launcher(self._launchers, self.name, config, self.run)

    def __call__(self, *args, **kwargs):
        name = self.owner.__name__
        raise TypeError(f"{name}.{self.what} is a CUDA kernel: launch it as "
                        f"{name}.{self.what}[blocks, threads](*args, *{self.slots})")


class _JvpProxy(_AdjointProxy):
    """``k.jvp[blocks, threads](*args, *tangents)``: forward mode (:mod:`kadj.jvp_call`,
    the tangent kernel of :mod:`kadj.cuda.tangent`)."""
    what, slots = "jvp", "tangents"

    def run(self, config, args, kwargs):
        from . import jvp_call
        return jvp_call.run(self.owner, args, kwargs, config=config)


class CudaDifferentiatedKernel(DifferentiatedKernel):
    """A ``@cuda.jit`` kernel together with its generated adjoint kernel."""

    target_name = "cuda"
    _expects = "kadj.differentiate expects a @cuda.jit kernel, got {!r}"

    def adjoint_trusted(self, plan, args, adjoints):
        """A device adjoint runs only as a launch (``adjoint[config]``)."""
        return False

    def __init__(self, dispatcher, wrt=None, checkpoints=None, gather=None):
        super().__init__(dispatcher, wrt=wrt, checkpoints=checkpoints, gather=gather)
        self.adjoint = _AdjointProxy(self)
        self.jvp = _JvpProxy(self)
        self._launches = {}     # kadj.cuda.call_facts: checked launches per signature
        self._forward_launchers = {}    # checked forward launch configurations

    def _adjoint_call(self, args, kwargs, config=None):
        """The checked (compiled adjoint, forward arguments, adjoints) of a launch: in
        full on the first launch of each signature, then only what the values decide
        (:mod:`kadj.cuda.call_facts`)."""
        if kwargs or config is None or self._rules_seen != rules.generation():
            return super()._adjoint_call(args, kwargs, config=config)
        key = call_facts.signature(args, config)
        facts = self._launches.get(key) if key is not None else None
        if facts is not None and facts.accepts(args):
            n = len(facts.comp.plan.arg_names)
            self._last = facts.comp
            return facts.comp, tuple(args[:n]), tuple(args[n:])
        comp, fwd, adjs = super()._adjoint_call(args, kwargs, config=config)
        if key is not None and len(fwd) + len(adjs) == len(args):
            call_facts.remember(self._launches, key, comp, args)
        return comp, fwd, adjs

    def _forget_adjoints(self):
        super()._forget_adjoints()
        self._launches = {}

    @property
    def checkpoints(self):
        """Per-thread checkpoint slots of loops that carry state (option)."""
        return self.options["checkpoints"]

    @property
    def gather(self):
        """Whether the gather form is used when a launch allows it (option)."""
        return self.options["gather"]

    def __repr__(self):
        return f"<kadj differentiated CUDA kernel {self.__name__}>"

    # ---- forward --------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.__name__} is a CUDA kernel: launch it as "
                        f"{self.__name__}[blocks, threads](*args)")

    def __getitem__(self, config):
        """``k[grid, block](*args)`` / ``k[grid, block, stream](*args)``: the forward
        launch, recorded on the active :class:`kadj.Tape` if there is one.  A grid or
        block with a dimension below 1, a non-integer dimension or a block of more than
        1024 threads is refused here (a launch that computes nothing, or that the GPU
        would refuse)."""
        return _launcher(self._forward_launchers, self.__name__, config, self._launch)

    def _launch(self, config, args, kwargs=None):
        from . import tape as _tape
        if kwargs:
            args = validate.bind(self.__name__, self.arg_names,
                                 self.py_func.__defaults__ or (), args, kwargs)
        validate.check_transferable(self.__name__, self.arg_names, args)
        if _tape.active() is not None:
            # the tape's backward launches the adjoint with this configuration: refuse
            # it now, naming this launch, rather than after the whole sequence ran
            self.check_adjoint_launch(f"{self.__name__} (recorded on a kadj.Tape)",
                                      config, self.compiled(*args))
        return self._forward(args, lambda: self.dispatcher[config](*args), config=config)

    def forward(self, config, *args):
        """Launch the forward kernel without recording it."""
        validate.check_transferable(self.__name__, self.arg_names, args)
        return self.dispatcher[config](*args)

    # ---- adjoint --------------------------------------------------------------------
    def adjoint_source(self, *example_args, form="scatter"):
        """The generated adjoint kernel: ``form`` "scatter" (atomics), "gather" or
        "zero" (the two kernels of the gather form, when the kernel has one)."""
        if form != "scatter":
            return self._pick(self.compiled(*example_args), form)[2]
        return super().adjoint_source(*example_args)

    def adjoint_report(self, *args):
        """How each adjoint accumulation is done: ``atomics`` (count of
        ``cuda.atomic.add`` in the source), ``plain_accumulations`` (``+=`` into
        thread-private elements), ``private_arrays``."""
        return dict(self.compiled(*args).report)

    def adjoint_signature(self, *args, form="scatter"):
        """numba signature (tuple of types) of the adjoint kernel for these arguments;
        ``form`` as for :meth:`adjoint_source` (the gather form's two kernels also take
        the slots array of :mod:`kadj.cuda.slots` when they have one)."""
        if form != "scatter":
            return self._form_signature(args, form)
        comp = self.compiled(*args)
        fwd_types = self._arg_types(args)
        adj_types = []
        for i in comp.plan.adjoint_args:
            t = fwd_types[i]
            if isinstance(t, types.Array):
                adj_types.append(t)
            else:
                adj_types.append(types.Array(t, 1, "C"))
        from .cuda.atomic_extrema import signature_extra
        from .cuda.own_rows import signature_extra as rows_extra
        return tuple(fwd_types) + signature_extra(comp, fwd_types) + \
            rows_extra(comp, fwd_types) + tuple(adj_types)

    def adjoint_ptx(self, *args, cc=(9, 0), form="scatter"):
        """PTX text of the adjoint kernel (``numba.cuda.compile_ptx``; no GPU needed);
        ``form`` as for :meth:`adjoint_source`."""
        if simulator_enabled():
            # the verdict is the compiler's (kadj.cuda.verdict): a refusal is raised here,
            # in full, before a child process compiles the accepted adjoint
            self._pick(self.compiled(*args), form)
            return _ptx_in_subprocess(self, args, cc, form)
        from numba import cuda
        from .cuda.ptx_cc import for_cc
        fn = self._pick(self.compiled(*args), form)[0]
        with for_cc(cc), compiling():
            ptx, _resty = cuda.compile_ptx(fn, self._form_signature(args, form), cc=cc)
        return ptx

    def _form_signature(self, args, form):
        """The signature of the adjoint kernel in ``form``: the gather form's two
        kernels also take the slots array (kadj.cuda.slots) when they have one."""
        sig = self.adjoint_signature(*args)
        comp = self.compiled(*args)
        self._pick(comp, form)      # an unknown form, or no gather form: refused
        if form != "scatter" and comp.gather is not None and comp.gather.slot_rows:
            sig += (types.Array(types.float64, 1, "C"),)
        return sig

    def jvp_ptx(self, *args, cc=(9, 0)):
        """PTX text of the tangent kernel (forward mode, ``jvp``) for these forward
        arguments (``numba.cuda.compile_ptx``; no GPU needed)."""
        from . import jvp_call
        comp = jvp_call.compiled(self, self.complete_args(args))
        if simulator_enabled():
            return _ptx_in_subprocess(self, args, cc, "jvp")
        from numba import cuda
        from .cuda.ptx_cc import for_cc
        sig = comp.signature(self._arg_types(self.complete_args(args)))
        with for_cc(cc), compiling():
            ptx, _resty = cuda.compile_ptx(comp.pyfunc, sig, cc=cc)
        return ptx

    def _pick(self, comp, form):
        """(Python function, kernel, source) of the adjoint in ``form``: "scatter",
        or "gather" / "zero" (the two kernels of the gather form)."""
        if form == "scatter":
            return comp.pyfunc, comp.kernel, comp.source
        if form not in ("gather", "zero"):
            raise ValueError(f"form must be 'scatter', 'gather' or 'zero', not {form!r}")
        if comp.gather is None:
            raise DifferentiationError(f"{self.__name__} has no gather form: "
                                       f"{comp.report['gather']['why']}",
                                       kernel=self.__name__)
        k = 0 if form == "gather" else 1
        return comp.gather.pyfuncs[k], comp.gather.kernels[k], comp.gather.sources[k]

    def adjoint_resources(self, *args, form="scatter"):
        """Registers per thread, local memory per thread and static shared memory per
        block of the compiled adjoint kernel (``form`` as for :meth:`adjoint_source`;
        the gather form's first kernel).  Needs a GPU (the driver compiles it)."""
        from numba import cuda
        if simulator_enabled() or not cuda.is_available():
            raise DifferentiationError(
                "adjoint_resources() needs a CUDA GPU (the driver reports registers and "
                "memory); adjoint_ptx() works without one", kernel=self.__name__)
        from numba.core import types
        kern = self._pick(self.compiled(*args), form)[1]
        sig = types.void(*self._form_signature(args, form))   # numba-cuda wants a Signature
        kern.compile(sig)
        return {"registers": kern.get_regs_per_thread(sig),
                "local_memory_per_thread": kern.get_local_mem_per_thread(sig),
                "shared_memory_per_block": kern.get_shared_mem_per_block(sig),
                "max_threads_per_block": kern.get_max_threads_per_block(sig)}

    def check_adjoint_launch(self, call, config, comp):
        """Refuse an adjoint launch ``config`` that extends along a dimension whose
        thread or block index the kernel never reads (duplicated threads):
        :func:`kadj.cuda.threads.check_launch_dims`."""
        from .cuda.threads import check_launch_dims
        check_launch_dims(self.__name__, call, config, *comp.dims)

    def _run_adjoint(self, config, args, kwargs=None):
        comp, fwd, adjs = self._adjoint_call(args, kwargs, config=config)
        wins = winners(self, comp, config, fwd)     # cuda.atomic.max/min: extra launches
        wins += buffers(comp, fwd, config)          # own rows updated in place: buffers
        if wins:
            comp.kernel[config](*fwd, *wins, *adjs)
            return
        g = comp.gather
        if g is not None and g.covers(config, fwd):
            # each thread gathers its elements, then the written elements' adjoints are
            # consumed (and the scalar adjoints' slots summed: kadj.cuda.slots)
            launch_gather(g.kernels, config, fwd + adjs, g.slot_rows)
        else:
            comp.kernel[config](*fwd, *adjs)


_PTX_CHILD = r"""
import importlib, importlib.util, json, pickle, sys
result = {}
try:
    paths, modname, path, qualname, options, args, cc, form = pickle.load(sys.stdin.buffer)
    sys.path[:] = paths
    import kadj
    from kadj.cuda_api import CudaDifferentiatedKernel
    if modname != "__main__":
        module = importlib.import_module(modname)
    else:
        spec = importlib.util.spec_from_file_location("_kadj_ptx_module", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, CudaDifferentiatedKernel):
        obj = obj.dispatcher
    k = kadj.differentiate(obj, **options)
    result["ptx"] = k.jvp_ptx(*args, cc=cc) if form == "jvp" else \
        k.adjoint_ptx(*args, cc=cc, form=form)
except BaseException as exc:
    loc = getattr(exc, "loc", None)
    result = {"error": type(exc).__name__, "message": str(exc),
              "kernel": getattr(exc, "kernel", None),
              "construct": getattr(exc, "construct", None),
              "remedy": getattr(exc, "remedy", None),
              "loc": None if loc is None else [getattr(loc, "filename", None),
                                               getattr(loc, "line", None),
                                               getattr(loc, "col", None)]}
sys.stdout.write(MARK + json.dumps(result, default=str))
"""
_PTX_MARK = "\n<<kadj adjoint_ptx result>>\n"


def _ptx_in_subprocess(k, args, cc, form):
    """Under NUMBA_ENABLE_CUDASIM=1 numba-cuda's compiler is replaced by the simulator:
    compile the adjoint's PTX in a child process without it, which imports the kernel's
    module from its file (kernels defined in a module file, at module level).  The child
    reports the PTX or its exception (type, full message) as JSON after a marker line;
    a :class:`DifferentiationError` there is raised here with the same text."""
    import json
    import os
    import pickle
    import subprocess
    import sys
    path = k.py_func.__code__.co_filename
    qualname = k.py_func.__qualname__
    why = None
    if not os.path.isfile(path) or "<locals>" in qualname:
        why = "the kernel is not defined at module level in a file"
    else:
        options = {"wrt": k.wrt, "checkpoints": k.checkpoints, "gather": k.gather}
        env = {key: v for key, v in os.environ.items() if key != "NUMBA_ENABLE_CUDASIM"}
        try:
            payload = pickle.dumps((list(sys.path), k.py_func.__module__, path, qualname,
                                    options, tuple(args), tuple(cc), form))
            child = f"MARK = {_PTX_MARK!r}\n{_PTX_CHILD}"
            proc = subprocess.run([sys.executable, "-c", child], input=payload,
                                  capture_output=True, env=env, timeout=600)
        except (pickle.PicklingError, TypeError, subprocess.TimeoutExpired) as exc:
            why = f"{type(exc).__name__}: {exc}"
        else:
            out = proc.stdout.decode(errors="replace")
            if _PTX_MARK in out:
                result = json.loads(out.rsplit(_PTX_MARK, 1)[1])
                if "ptx" in result:
                    return result["ptx"]
                if result["error"] == "DifferentiationError":
                    raise _differentiation_error(result)
                why = f"{result['error']}: {result['message']}"
            else:  # the child died before reporting: its whole error output
                err = proc.stderr.decode(errors="replace").strip()
                why = err[-4000:] if err else f"exit status {proc.returncode}"
    what = "jvp_ptx" if form == "jvp" else "adjoint_ptx"
    raise DifferentiationError(
        f"{what}() needs numba-cuda's compiler, which NUMBA_ENABLE_CUDASIM=1 replaces "
        f"by the simulator, and compiling in a separate process failed ({why})",
        kernel=k.__name__, construct=f"{what} under the simulator",
        remedy=f"call {what} in a process without NUMBA_ENABLE_CUDASIM")


def _differentiation_error(report):
    """The child's DifferentiationError: the same text and attributes."""
    from numba.core.ir import Loc
    exc = DifferentiationError(report["message"])  # no parts: the text unchanged
    exc.kernel, exc.construct, exc.remedy = (report["kernel"], report["construct"],
                                             report["remedy"])
    if report["loc"] is not None:
        filename, line, col = report["loc"]
        exc.loc = Loc(filename, line, col)
    return exc
