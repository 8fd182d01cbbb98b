"""The differentiated CUDA kernel: ``@kadj.differentiate`` above ``@cuda.jit``.

::

    k[blocks, threads](u, u_new, alpha)                                # forward
    k.adjoint[blocks, threads](u, u_new, alpha, adj_u, adj_u_new, adj_alpha)
    k.adjoint_source(u, u_new, alpha)       # the generated adjoint kernel (Python)
    k.adjoint_plan(u, u_new, alpha)         # AdjointPlan, as for CPU kernels
    k.adjoint_ptx(u, u_new, alpha, cc=(9, 0))   # PTX of the adjoint (no GPU needed)
    k.adjoint_report(u, u_new, alpha)       # accumulation decisions (atomics, plain)

The pipeline: :mod:`kadj.cuda.frontend` (numba-cuda's typing context; under the
simulator, :mod:`kadj.cuda.shim`) -> :mod:`kadj.cuda.structure` -> kadj.analysis ->
:mod:`kadj.cuda.writer` -> ``cuda.jit``.  Under the simulator the adjoint runs in the
simulator like any kernel (where a block's threads run one after another, so a missing
atomic goes unnoticed: check :meth:`adjoint_ptx`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from numba.core import types
from numba.core.errors import NumbaError

from . import analysis, ir, rules, validate
from .api import DifferentiatedKernel, _raise_clearer
from .cuda.frontend import simulator_enabled
from .errors import DifferentiationError

_CUDA_OPTIONS_KEPT = ("fastmath", "debug", "lineinfo", "opt")


@dataclass(frozen=True)
class CompiledCudaAdjoint:
    plan: object
    source: str
    pyfunc: object          # the adjoint as a plain Python function
    kernel: object          # cuda.jit(pyfunc)
    report: dict
    gather: object = None   # _Gather, when the kernel has a gather form
    typed: object = None    # the TypedKernel it was built from (kadj.cuda.verdict)
    dims: tuple = ((), ())  # (block, grid) index dimensions the kernel reads


@dataclass(frozen=True)
class _Gather:
    arrays: dict            # array -> (perm, offsets)
    arg_index: dict         # array -> argument position
    ndim: int
    sources: tuple          # (gather source, zero source)
    pyfuncs: tuple
    kernels: tuple

    def covers(self, config, args):
        """Does the launch have a thread for every element of each gathered array?"""
        grid, block = _dims(config[0]), _dims(config[1])
        threads = [g * b for g, b in zip(grid, block)]
        for name, (perm, _) in self.arrays.items():
            shape = args[self.arg_index[name]].shape
            if any(threads[d] < shape[k] for k, d in enumerate(perm)):
                return False
        return True


def _dims(d):
    d = tuple(d) if isinstance(d, (tuple, list)) else (int(d),)
    return tuple(int(x) for x in d) + (1,) * (3 - len(d))


def _typeof(a):
    """numba type of a launch argument: NumPy and numba device arrays, scalars, and
    any object exporting ``__cuda_array_interface__`` (CuPy arrays)."""
    import numba
    try:
        return numba.typeof(a)
    except (ValueError, TypeError):
        if hasattr(a, "__cuda_array_interface__"):
            from numba import cuda
            return numba.typeof(cuda.as_cuda_array(a))
        raise


class _Launcher:
    def __init__(self, fn, config):
        self.fn, self.config = fn, config

    def __call__(self, *args, **kwargs):
        return self.fn(self.config, args, kwargs)


class _AdjointProxy:
    def __init__(self, owner):
        self.owner = owner

    def __getitem__(self, config):
        validate.check_launch(f"{self.owner.__name__}.adjoint", config)
        return _Launcher(self.owner._run_adjoint, config)

    def __call__(self, *args):
        raise TypeError(f"{self.owner.__name__}.adjoint is a CUDA kernel: launch it as "
                        f"{self.owner.__name__}.adjoint[blocks, threads](*args, *adjoints)")


class CudaDifferentiatedKernel:
    """A ``@cuda.jit`` kernel together with its generated adjoint kernel."""

    def __init__(self, dispatcher, wrt=None, checkpoints=None, gather=True):
        if not hasattr(dispatcher, "py_func"):
            raise TypeError(f"kadj.differentiate expects a @cuda.jit kernel, got "
                            f"{dispatcher!r}")
        self.dispatcher = dispatcher
        self.py_func = dispatcher.py_func
        self.__name__ = self.py_func.__name__
        self.__doc__ = self.py_func.__doc__
        self.__wrapped__ = self.py_func
        self.wrt = tuple(wrt) if wrt is not None else None
        from .cuda.writer import DEFAULT_SLOTS
        self.checkpoints = DEFAULT_SLOTS if checkpoints is None else int(checkpoints)
        self.gather = bool(gather)
        if self.checkpoints < 1:
            raise ValueError("checkpoints must be a positive number of slots")
        code = self.py_func.__code__
        self.arg_names = tuple(code.co_varnames[:code.co_argcount])
        if self.wrt is not None:
            unknown = [w for w in self.wrt if w not in self.arg_names]
            if unknown:
                raise ValueError(f"wrt names {unknown} are not arguments of "
                                 f"{self.__name__}{self.arg_names}")
        self._cache = {}
        self._lock = threading.Lock()
        self._last = None
        self._rules_seen = rules.generation()
        self.adjoint = _AdjointProxy(self)

    def __repr__(self):
        return f"<kadj differentiated CUDA kernel {self.__name__}>"

    # ---- forward --------------------------------------------------------------------
    def __getitem__(self, config):
        """``k[grid, block](*args)`` / ``k[grid, block, stream](*args)``: the forward
        launch, recorded on the active :class:`kadj.Tape` if there is one.  A grid or
        block with a dimension below 1, a non-integer dimension or a block of more than
        1024 threads is refused here (a launch that computes nothing, or that the GPU
        would refuse)."""
        validate.check_launch(self.__name__, config)
        return _Launcher(self._launch, config)

    def _launch(self, config, args, kwargs=None):
        from . import tape as _tape
        if kwargs:
            args = validate.bind(self.__name__, self.arg_names,
                                 self.py_func.__defaults__ or (), args, kwargs)
        validate.check_transferable(self.__name__, self.arg_names, args)
        t = _tape.active()
        if t is not None:
            # the tape's backward launches the adjoint with this configuration: refuse
            # it now, naming this launch, rather than after the whole sequence ran
            self.check_adjoint_launch(f"{self.__name__} (recorded on a kadj.Tape)",
                                      config, self.compiled(*args))
            return t.record(self, args, config=config)
        _tape.check_unrecorded(self, args)
        try:
            return self.dispatcher[config](*args)
        except NumbaError as exc:
            _raise_clearer(self.__name__, self.arg_names, args, exc)
            raise

    def forward(self, config, *args):
        """Launch the forward kernel without recording it."""
        validate.check_transferable(self.__name__, self.arg_names, args)
        return self.dispatcher[config](*args)

    # ---- compilation ----------------------------------------------------------------
    def _arg_types(self, args):
        if len(args) != len(self.arg_names):
            raise TypeError(f"{self.__name__} takes {len(self.arg_names)} arguments "
                            f"{self.arg_names}, got {len(args)}")
        validate.check_arguments(self.__name__, self.arg_names, args)
        arg_types = []
        for name, a in zip(self.arg_names, args):
            try:
                t = _typeof(a)
            except (ValueError, TypeError):
                t = types.pyobject
            if t == types.pyobject:
                raise validate.unsupported_type(self.__name__, name, a)
            arg_types.append(t)
        return tuple(arg_types)

    def compiled(self, *args):
        if self._rules_seen != rules.generation():
            with self._lock:   # adjoints built under an older rule table are rebuilt
                self._rules_seen = rules.generation()
                self._cache = {}
        arg_types = self._arg_types(args)
        hit = self._cache.get(arg_types)
        if hit is None:
            with self._lock:
                hit = self._cache.get(arg_types)
                if hit is None:
                    try:
                        hit = self._build(arg_types)
                    except NumbaError as exc:
                        _raise_clearer(self.__name__, self.arg_names, args, exc)
                        raise
                    self._cache[arg_types] = hit
        self._last = hit
        return hit

    def _options(self):
        opts = getattr(self.dispatcher, "targetoptions", None) or {}
        return {k: opts[k] for k in _CUDA_OPTIONS_KEPT if k in opts}

    def _build(self, arg_types):
        from .cuda.frontend import type_kernel
        from .cuda.structure import structurize_cuda
        from .cuda.writer import write_cuda_adjoint
        tk = type_kernel(self.py_func, arg_types)  # the same IR with or without simulator
        kernel = structurize_cuda(tk)
        # the argument layout is the CPU one (DifferentiatedKernel._plan)
        plan = DifferentiatedKernel._plan(self, kernel, arg_types)
        if plan.returns_value:
            raise DifferentiationError("CUDA kernels cannot return values",
                                       kernel=self.__name__)
        slot_names = tuple(self.arg_names[i] for i in plan.adjoint_args)
        kernel, cells = _with_cells(kernel, slot_names)
        space = {st.target: getattr(st.expr.fn, "path", None)
                 for st in ir.walk(kernel.body)
                 if isinstance(st, ir.Assign) and isinstance(st.expr, ir.Alloc)}
        shared = {v for v, p in space.items() if p == "shared.array"}
        an = analysis.analyze(
            kernel, slot_names, False, carried_replay=True,
            private_scratch={v for v, p in space.items() if p == "local.array"},
            shared_scratch=shared, owned_shared=set(_owned_shared(kernel, shared)),
            unwritten=set(cells))
        adj, report, writer = write_cuda_adjoint(kernel, an, slot_names,
                                                 slots=self.checkpoints, cells=cells)
        pyfn, jitted = self._compile(adj)
        gather = self._build_gather(kernel, an, slot_names, cells, report, writer) \
            if self.gather else None
        if not self.gather:
            report["gather"] = {"used": False, "why": "disabled (gather=False)"}
        return CompiledCudaAdjoint(plan, adj.source, pyfn, jitted, report, gather, tk,
                                   (writer.index.block_dims, writer.index.grid_dims))

    def _compile(self, adj):
        from numba import cuda
        ns = dict(adj.namespace)
        code = compile(adj.source, f"<kadj adjoint of {self.__name__}>", "exec")
        exec(code, ns)
        pyfn = ns[adj.name]
        return pyfn, cuda.jit(**self._options())(pyfn)

    def _build_gather(self, kernel, an, slot_names, cells, report, writer):
        """The gather form, when ``writer`` (the scatter form's, for its index
        analysis and array classes) shows the kernel qualifies."""
        from .cuda.gather import gather_plan, write_gather
        plan, why = gather_plan(kernel, an, writer)
        if plan is None:
            report["gather"] = {"used": False, "why": why}
            return None
        sources = write_gather(kernel, an, slot_names, plan, cells=cells)
        compiled = [self._compile(src) for src in sources]
        report["gather"] = {
            "used": "when the launch has a thread for every element of "
                    + ", ".join(sorted(plan)),
            "arrays": {n: sorted(offs) for n, (perm, offs) in sorted(plan.items())},
            "passes": len({o for _, offs in plan.values() for o in offs} |
                          {tuple([0] * writer.index.ndim)}),
        }
        return _Gather(plan, {n: self.arg_names.index(n) for n in plan},
                       writer.index.ndim, tuple(s.source for s in sources),
                       tuple(c[0] for c in compiled), tuple(c[1] for c in compiled))

    # ---- adjoint --------------------------------------------------------------------
    def adjoint_plan(self, *args):
        return self.compiled(*args).plan

    def adjoint_source(self, *example_args, form="scatter"):
        """The generated adjoint kernel: ``form`` "scatter" (atomics), "gather" or
        "zero" (the two kernels of the gather form, when the kernel has one)."""
        if form != "scatter":
            return self._pick(self.compiled(*example_args), form)[2]
        if example_args:
            return self.compiled(*example_args).source
        if self._last is None:
            raise DifferentiationError(
                "adjoint_source() needs example arguments until the adjoint has been "
                "compiled once", kernel=self.__name__)
        return self._last.source

    def adjoint_report(self, *args):
        """How each adjoint accumulation is done: ``atomics`` (count of
        ``cuda.atomic.add`` in the source), ``plain_accumulations`` (``+=`` into
        thread-private elements), ``private_arrays``."""
        return dict(self.compiled(*args).report)

    def adjoint_signature(self, *args):
        """numba signature (tuple of types) of the adjoint kernel for these arguments."""
        comp = self.compiled(*args)
        fwd_types = self._arg_types(args)
        adj_types = []
        for i in comp.plan.adjoint_args:
            t = fwd_types[i]
            if isinstance(t, types.Array):
                adj_types.append(t)
            else:
                adj_types.append(types.Array(t, 1, "C"))
        return tuple(fwd_types) + tuple(adj_types)

    def adjoint_ptx(self, *args, cc=(9, 0), form="scatter"):
        """PTX text of the adjoint kernel (``numba.cuda.compile_ptx``; no GPU needed);
        ``form`` as for :meth:`adjoint_source`."""
        if simulator_enabled():
            # the verdict is the compiler's (kadj.cuda.verdict): a refusal is raised here,
            # in full, before a child process compiles the accepted adjoint
            self._pick(self.compiled(*args), form)
            return _ptx_in_subprocess(self, args, cc, form)
        from numba import cuda
        fn = self._pick(self.compiled(*args), form)[0]
        ptx, _resty = cuda.compile_ptx(fn, self.adjoint_signature(*args), cc=cc)
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
        kern = self._pick(self.compiled(*args), form)[1]
        sig = self.adjoint_signature(*args)
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
        call = f"{self.__name__}.adjoint"
        fwd, adjs, by_name = validate.split_adjoint_call(
            call, self.arg_names, self.py_func.__defaults__ or (), args, kwargs or {})
        comp = self.compiled(*fwd)
        self.check_adjoint_launch(call, config, comp)
        adjs = validate.order_adjoints(call, comp.plan, fwd, adjs, by_name)
        validate.check_adjoint_call(call, comp.plan, fwd, adjs)
        validate.check_transferable(call, self.arg_names + comp.plan.adjoint_names(),
                                    fwd + adjs)
        g = comp.gather
        if g is not None and g.covers(config, fwd):
            g.kernels[0][config](*fwd, *adjs)   # each thread gathers its elements
            g.kernels[1][config](*fwd, *adjs)   # then the written elements' are consumed
        else:
            comp.kernel[config](*fwd, *adjs)


def _with_cells(kernel, slot_names):
    """Scalar cells for in-place updates of a thread's own element (kadj.cuda.cells)."""
    from .cuda.cells import insert_cells
    from .cuda.indexing import ThreadIndex, array_accesses
    index = ThreadIndex.of(kernel)
    classes = {name: index.classify(name, idxs)
               for name, idxs in array_accesses(kernel).items()}
    params = {a for a in kernel.args if isinstance(kernel.types.get(a), types.Array)}
    return insert_cells(kernel, index, classes, params)


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
    result["ptx"] = k.adjoint_ptx(*args, cc=cc, form=form)
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
    raise DifferentiationError(
        f"adjoint_ptx() needs numba-cuda's compiler, which NUMBA_ENABLE_CUDASIM=1 replaces "
        f"by the simulator, and compiling in a separate process failed ({why})",
        kernel=k.__name__, construct="adjoint_ptx under the simulator",
        remedy="call adjoint_ptx in a process without NUMBA_ENABLE_CUDASIM")


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


def _owned_shared(kernel, shared):
    """{shared array: index operands} for the shared arrays every thread writes only at
    its own element (``sm[threadIdx.x]``): a thread can save and restore that element."""
    from .cuda.indexing import ThreadIndex
    index = ThreadIndex.of(kernel)
    keys = {}
    for st in ir.walk(kernel.body):
        if isinstance(st, ir.Store) and st.array.name in shared:
            if st.accumulate:
                keys.setdefault(st.array.name, set()).add(None)
                continue
            keys.setdefault(st.array.name, set()).add(
                index.owned_key(st.index, index.local, index.block_ndim))
    out = {}
    for name, ks in keys.items():
        if len(ks) == 1 and None not in ks:
            key = next(iter(ks))
            out[name] = tuple(ir.Var(v) if kind == "c" else ir.Const(v) for kind, v in key)
    return out
