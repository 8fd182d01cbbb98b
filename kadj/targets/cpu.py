"""The CPU target: ``@numba.njit`` kernels, adjoints compiled with ``numba.njit``.

Typing: numba's CPU typing and target contexts (:func:`kadj.frontend.type_cpu_kernel`);
preparation: running extrema (:mod:`kadj.running_extremum`), ``x * sqrt(x)``
(:mod:`kadj.fused_ops`), elements stored and read back (:mod:`kadj.store_forwarding`),
loads of what an argument held on entry (:mod:`kadj.entry_loads`), in that order; the
adjoint is written by :func:`kadj.reverse.write_adjoint`,
saved in kadj's disk cache and compiled by numba with the kernel's own options (and
numba's own disk cache).  The tape of a reversed loop is a heap array that grows
("growable"); adjoint contributions are plain ``+=`` ("plain"), except the sums into
a scalar adjoint inside a reversed loop, which LLVM may reassociate and vectorise
(:mod:`kadj.vector_sums`).  A replayed loop's iterations run several at a time, side
by side, where their order cannot matter (:mod:`kadj.lane_jam`).

Option ``parallel`` (default None): the reversed loops that the kernel wrote with
``prange`` run in parallel (``numba.prange``, compiled with ``parallel=True``) when the
analysis finds their iterations independent and the adjoint's writes private to each
iteration or reductions (:mod:`kadj.parallel`); True also every independent ``for``
loop (the outermost of a nest); False: every loop serial.

Option ``gather`` (default True): the adjoint of a stencil loop nest (each iteration
writes its own element and reads arrays at constant offsets of the loop counters) takes
the gather form, each adjoint element written once (:mod:`kadj.cpu_gather`; which nests
qualify: :mod:`kadj.gather_plan`), unless its scatter form runs in parallel; a nest asked
to run in parallel whose scatter form would race (a neighbour stencil) runs the gather
form's loops in parallel where race-free; a stencil nest inside another loop (the
stencil loops of a time loop's steps) takes it too when it qualifies on its own
(:func:`kadj.gather_plan.cpu_stencil_nests`); False: the scatter form.

Option ``checkpoints`` (default None: off): with ``checkpoints=N`` (or True: 24), loops
whose iterations carry state and would record a tape growing with their trip count
(a per-element time loop, a recurrence) are reversed from N checkpoints of their state
(:mod:`kadj.checkpoint_reverse`), as on a GPU: the analysis' ``carried_replay`` policy.
"""
from __future__ import annotations

from .. import codegen, cpu_gather, frontend, gather_plan, parallel, reverse, structurize
from .. import call_memory, entry_loads, fused_ops, running_extremum, store_forwarding
from ..kept_memory import keep_memory
from ..iteration_slots import index_fresh_saves
from ..lane_jam import jam_replayed
from ..replay_blocks import parallel_replays, serial_unless_outlined
from ..row_outline import outline_rows
from ..shared_factors import share_factors
from ..simplify_zero import float64_only
from ..thread_parts import launch_threads
from ..vector_sums import vector_sums
from .base import CompiledAdjoint, Prepared, Target, Written, checkpoint_slots

_JIT_OPTIONS_KEPT = ("fastmath", "error_model", "boundscheck", "nogil")


def _recognises(dispatcher):
    return frontend.is_jitted(dispatcher) and "cuda" not in type(dispatcher).__module__


def _typeof(dispatcher, value):
    return dispatcher.typeof_pyval(value)


def jit_options(dispatcher):
    opts = getattr(dispatcher, "targetoptions", {}) or {}
    kept = {k: opts[k] for k in _JIT_OPTIONS_KEPT if k in opts}
    # IEEE arithmetic: a singular partial (sqrt at 0) gives inf/nan, never an exception
    kept["error_model"] = "numpy"
    return kept


def _type_kernel(dispatcher, arg_types):
    return frontend.type_cpu_kernel(dispatcher, arg_types)


def _prepare(kernel, plan):
    kernel = fused_ops.rewrite(running_extremum.rewrite(kernel))
    return Prepared(entry_loads.rewrite(store_forwarding.rewrite(kernel)))


def _check_option(kernel_name, option, value):
    if option == "gather":
        if not isinstance(value, bool):
            raise ValueError(f"gather must be True or False, not {value!r}")
        return value
    if option == "parallel":
        if not isinstance(value, bool):
            raise ValueError(f"parallel must be True or False, not {value!r}")
        return value
    return checkpoint_slots(value)


def _policy(options):
    """``checkpoints=N``: loops that carry state are reversed from checkpoints."""
    return {"carried_replay": True} if options.get("checkpoints") else {}


def gather_form(kernel, facts, options):
    """(:class:`kadj.gather_plan.StencilNest`, "") when the adjoint may take the gather
    form (:mod:`kadj.cpu_gather`), else (None, why not)."""
    if options.get("gather") is False:
        return None, "disabled (gather=False)"
    return gather_plan.cpu_stencil_plan(kernel, facts)


def _nested_gather(kernel, facts, options):
    """The stencil nests inside other loops whose reverse takes the gather form
    (:func:`kadj.gather_plan.cpu_stencil_nests`); none with ``gather=False`` or with
    ``checkpoints=`` (whose loops the scatter writer reverses from checkpoints)."""
    if options.get("gather") is False or options.get("checkpoints"):
        return []
    return gather_plan.cpu_stencil_nests(kernel, facts)


def _write(prepared, facts, plan, options):
    """The scatter form with its loops run in parallel where asked and possible;
    otherwise the gather form of a stencil nest, when the kernel qualifies; otherwise
    the scatter form."""
    kernel = prepared.kernel
    slot_names = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    wanted = parallel.parallel_loops(kernel, options.get("parallel"))
    nest, _why = gather_form(kernel, facts, options)
    in_parallel = nest is not None and bool(wanted & {level.uid for level in nest.levels})
    if wanted:
        fn, w = reverse.build_adjoint(kernel, facts, slot_names, plan.returns_value,
                                      slots=options.get("checkpoints"))
        # values recorded per iteration at the iteration's own row of the tape
        # (kadj.iteration_slots); the reversed loops, and the forward sweep's own
        # loops (a loss summed over prange before the reverse sweep); iterations
        # adding into shared elements in parts (kadj.thread_parts), unless the loop
        # is a stencil nest whose gather form writes each element once
        index_fresh_saves(fn, wanted)
        made = len(parallel.parallelise(fn, w.ns, wanted, array_sums=not in_parallel))
        made += parallel.parallelise_primal(fn, w.ns, wanted)
        # replayed loops in parallel blocks or parts, each block's iterations side by
        # side where they qualify (kadj.lane_jam.jam_within); the replayed loops that
        # stay serial side by side where they qualify
        made += parallel_replays(fn, w.ns, wanted)
        jam_replayed(fn)
        if made:
            vector_sums(fn, w)      # (loops made parallel keep their += reductions)
            _outline_rows(fn, w, options)
            return _written(fn, w)
    if nest is not None and not in_parallel and options.get("gather") is None and \
            not gather_plan.faster_serial(nest):
        nest = None     # serial, 3-D or with divisions or functions: scatter is faster
    if nest is not None:
        fn, w = cpu_gather.build_gather_adjoint(kernel, facts, slot_names,
                                                plan.returns_value, nest,
                                                serial=not in_parallel)
        if in_parallel:
            # each element's adjoint written once: the loops over the elements, and the
            # sums' loop (reductions), run in parallel where race-free
            parallel.parallelise_loops(fn, w.ns, w.outer_loops)
    elif not wanted:
        # the stencil nests of a time loop's steps in the gather form, the rest scatter
        nested = _nested_gather(kernel, facts, options)
        if nested:
            fn, w = cpu_gather.build_gather_adjoint(kernel, facts, slot_names,
                                                    plan.returns_value, nested)
        else:
            fn, w = reverse.build_adjoint(kernel, facts, slot_names, plan.returns_value,
                                          slots=options.get("checkpoints"))
            jam_replayed(fn)    # replayed iterations side by side (kadj.lane_jam)
    vector_sums(fn, w)      # scalar sums in loops: LLVM may vectorise them
    _outline_rows(fn, w, options)
    return _written(fn, w)


def _written(fn, w):
    """The adjoint's source, the arrays it allocates once per call taken from memory
    its caller keeps (:mod:`kadj.kept_memory`); an element a block loads twice read
    under one name and sums its accumulations share computed once
    (:mod:`kadj.shared_factors`; the sums in float64 adjoints)."""
    share_factors(fn, factor=float64_only(w.T))
    layouts = {w.names[v]: t for v, t in w.T.items() if v in w.names}
    keep_memory(fn, w.ns, layouts)
    return Written(reverse.adjoint_source(fn, w.syntax, w.ns))


def _outline_rows(fn, w, options):
    """Parallel loops holding loops call their body as a function (kadj.row_outline),
    whose serial loops' scalar sums may vectorise (kadj.vector_sums)."""
    outline_rows(fn, w.ns, options["jit_options"])
    for _decorator, helper in fn.helpers:
        vector_sums(helper, w)
    serial_unless_outlined(fn)
    parallel.serial_where_numba_refuses(fn)


def _jit_options(source, request):
    """The kept compiler options, with ``parallel=True`` for an adjoint that runs a
    loop in parallel."""
    options = dict(request.jit_options)
    if parallel.is_parallel_source(source):
        options["parallel"] = True
        launch_threads()    # (a symbol a cached adjoint may call: kadj.thread_parts)
    return options


def _compile(written, plan, typed, key, request):
    adj = written.adjoint
    files = codegen.source_files(typed.func_ir)
    pyfn, disk = codegen.build(adj, plan, key, files, func_ir=typed.func_ir)
    return CompiledAdjoint(plan, adj.source,
                           *codegen.jit(pyfn, disk, _jit_options(adj.source, request)),
                           memory=call_memory.for_function(pyfn))


def _load(key, request):
    cached = codegen.load_cached(key)
    if cached is None:
        return None
    plan, source, pyfn, _report = cached
    return CompiledAdjoint(plan, source,
                           *codegen.jit(pyfn, True, _jit_options(source, request)),
                           memory=call_memory.for_function(pyfn))


CPU = Target(
    name="cpu", title="CPU", recognises=_recognises,
    kernel_class="kadj.kernel:DifferentiatedKernel",
    typeof=_typeof, jit_options=jit_options, type_kernel=_type_kernel,
    structurize=structurize.structurize, prepare=_prepare, write=_write, compile=_compile,
    load=_load, options={"checkpoints": None, "parallel": None, "gather": None},
    check_option=_check_option,
    returns_values=True, tape="growable", accumulation="plain", policy=_policy)
