"""The pipeline: the stages that turn a kernel into its compiled adjoint, for every target.

Each stage is a function of the ones before it; the target (:mod:`kadj.targets`)
supplies the target-specific functions, the stages are the same for all::

    typed     target.type_kernel(dispatcher, arg_types)    typed Numba IR
    region    target.structurize(typed), var_webs.split    region tree (kadj.ir.Kernel)
    plan      plan.build_plan(...)                         adjoint argument layout
    prepared  target.prepare(region, plan)                 target rewrites + policies
    facts     analysis.analyze(prepared, ..., **policies)  frozen analysis facts
    source    target.write(prepared, facts, plan, options) adjoint source(s), report
    compiled  target.compile(source, ...)                  compiled adjoint

(The plan comes before the preparation: the preparation may turn stores into scalar
cells, and which arrays the kernel writes is a fact of the kernel as the user wrote it.)

:func:`stages` returns every stage's output up to a given one (``python -m kadj show
--stage``); :func:`compile` is what a differentiated kernel calls: the disk cache first
(:mod:`kadj.codegen`; the key covers the target, its options and the jit options), then
the stages.  :data:`RUNS` counts how often each stage ran in this process.
"""
from __future__ import annotations

import collections
import dataclasses
import io

from . import analysis, codegen, gc_pause, ir
from . import plan as _plan
from .errors import DifferentiationError
from .targets.base import Request

STAGES = ("typed", "region", "plan", "prepared", "facts", "source", "compiled")
RUNS = collections.Counter()   # stage -> times run in this process ("loaded": from disk)


def resolve_options(target, kernel_name, given):
    """The target's options for a kernel: the defaults, replaced by the ``given`` ones
    that are not None.  An option the target does not support is refused."""
    out = dict(target.options)
    for option, value in (given or {}).items():
        if value is None:
            continue
        if not target.supports(option):
            supported = ", ".join(["wrt"] + sorted(target.options))
            raise DifferentiationError(
                f"the option {option}= does not apply to {target.title} kernels "
                f"({target.title} kernels take: {supported})",
                kernel=kernel_name, construct=f"differentiate(..., {option}=...)",
                remedy=f"leave out {option}= for this kernel")
        if option == "wrt":
            continue
        out[option] = target.check_option(kernel_name, option, value) \
            if target.check_option is not None else value
    return out


def request(target, kernel, arg_types, wrt=None, options=None, jit_options=None):
    """A :class:`~kadj.targets.base.Request` for ``kernel`` (a dispatcher or a
    differentiated kernel)."""
    dispatcher = getattr(kernel, "dispatcher", kernel)
    name = dispatcher.py_func.__name__
    options = resolve_options(target, name, options)
    if jit_options is None:
        jit_options = target.jit_options(dispatcher)
    return Request(dispatcher, tuple(arg_types), None if wrt is None else tuple(wrt),
                   dict(options), dict(jit_options))


def cache_key(target, req):
    options = dict(req.jit_options)
    options.update((k, v) for k, v in req.options.items() if v is not None)
    return codegen.cache_key(req.py_func, req.arg_types, req.wrt, options, target.name)


def stages(target, kernel, arg_types, wrt=None, options=None, until="compiled", *,
           jit_options=None, key=None):
    """Every stage's output up to ``until``, as an ordered dict {stage: output}."""
    if until not in STAGES:
        raise ValueError(f"until must be one of {', '.join(STAGES)}, not {until!r}")
    req = kernel if isinstance(kernel, Request) else \
        request(target, kernel, arg_types, wrt, options, jit_options)
    out = collections.OrderedDict()
    last = STAGES.index(until)

    def stage(name, fn, *args):
        RUNS[name] += 1
        with gc_pause.collector_paused():
            out[name] = fn(*args)
        return STAGES.index(name) >= last

    if stage("typed", target.type_kernel, req.dispatcher, req.arg_types):
        return out
    try:
        _after_typing(stage, out, target, req, key)
    except DifferentiationError as exc:
        retyped = getattr(out["typed"], "retyped", "")
        if retyped:
            exc.args = (f"{exc.args[0]}\n{RETYPED_NOTE.format(retyped)}",) + exc.args[1:]
        raise
    return out


#: appended to a refusal of a kernel typed with SSA (kadj.frontend)
RETYPED_NOTE = (
    "Note: numba could not type this kernel with one type per variable name (the first "
    "failure at {}: a name that holds an integer and a float, or a number and an "
    "array), so kadj typed it as numba compiles it, one version per assignment, a form "
    "in which some loops (a `for` left by `break`, for one) are not supported; a name "
    "of its own for each differently typed value avoids both.")


def _after_typing(stage, out, target, req, key):
    """The stages after "typed", each output put into ``out``, up to the last wanted."""
    if stage("region", _region, target, out["typed"]):
        return
    if stage("plan", _make_plan, target, req, out["region"]):
        return
    if stage("prepared", target.prepare, out["region"], out["plan"]):
        return
    if stage("facts", _facts, out["prepared"], out["plan"], target, req.options):
        return
    # (the adjoint's compiler options too: a function it prints is compiled with them)
    if stage("source", target.write, out["prepared"], out["facts"], out["plan"],
             dict(req.options, jit_options=dict(req.jit_options))):
        return
    if key is None:
        key = cache_key(target, req)
    stage("compiled", target.compile, out["source"], out["plan"], out["typed"], key, req)


def compile(target, req):
    """The compiled adjoint of ``req``: from the disk cache when an entry matches,
    else built by the stages (and written to the cache when it may be)."""
    key = cache_key(target, req)
    hit = target.load(key, req)
    if hit is not None:
        RUNS["loaded"] += 1
        return hit
    return stages(target, req, req.arg_types, until="compiled", key=key)["compiled"]


def tangent_stages(target, req):
    """Forward mode's stages (``kernel.jvp``, :mod:`kadj.jvp_call`): the adjoint's up
    to the facts, then "tangent", the tangent function's source (:mod:`kadj.tangent`, or
    the target's ``write_tangent``).  The
    options that only shape the reverse pass (checkpoints) are left out."""
    from . import tangent
    tangent.check_target(target, req.name)
    req = dataclasses.replace(req, options={k: None for k in req.options})
    out = stages(target, req, req.arg_types, until="facts")
    plan = out["plan"]
    RUNS["tangent"] += 1
    if target.write_tangent is not None:    # the target's own (device kernels)
        out["tangent"] = target.write_tangent(out["prepared"], out["facts"], plan)
        return out
    out["tangent"] = tangent.write_tangent(
        out["prepared"].kernel, out["facts"],
        tuple(plan.arg_names[i] for i in plan.adjoint_args), plan.returns_value)
    return out


def _region(target, typed):
    """The target's region tree, time loops that swap array names unrolled
    (:mod:`kadj.buffer_swap`), every web of a reused scalar name a variable of its own
    (:mod:`kadj.var_webs`)."""
    from .buffer_swap import rewrite
    from .var_webs import split
    return split(rewrite(target.structurize(typed)))


def _make_plan(target, req, region):
    from .complex_check import check_target
    check_target(target, region, req.name)
    plan = _plan.build_plan(req.name, req.arg_names, req.wrt, region, req.arg_types)
    if plan.returns_value and not target.returns_values:
        raise DifferentiationError(f"{target.title} kernels cannot return values",
                                   kernel=req.name)
    return plan


def _facts(prepared, plan, target=None, options=None):
    slot_names = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    policy = dict(prepared.analysis)
    if target is not None and target.policy is not None:
        policy.update(target.policy(options or {}))
    return analysis.analyze(prepared.kernel, slot_names, plan.returns_value, **policy)


# ---- printing the stages ---------------------------------------------------------------
SHOWN = ("typed", "region", "plan", "prepared", "facts", "adjoint-ir", "source",
         "tangent")


def show(target, kernel, arg_types, stage, wrt=None, options=None):
    """The text of one stage's output (``python -m kadj show --stage``)."""
    if stage not in SHOWN:
        raise ValueError(f"stage must be one of {', '.join(SHOWN)}, not {stage!r}")
    if stage == "adjoint-ir":
        return _adjoint_ir_text(target, kernel, arg_types, wrt, options)
    if stage == "tangent":
        req = kernel if isinstance(kernel, Request) else \
            request(target, kernel, arg_types, wrt, options)
        return tangent_stages(target, req)["tangent"].source
    out = stages(target, kernel, arg_types, wrt, options, until=stage)
    value = out[stage]
    if stage == "typed":
        buf = io.StringIO()
        value.func_ir.dump(file=buf)
        return buf.getvalue()
    if stage in ("region", "prepared"):
        text = _region_text(value.kernel if stage == "prepared" else value)
        if stage == "prepared" and value.analysis:
            text += "\n# analysis policy:\n" + "".join(
                f"#   {k} = {_plain(v)}\n" for k, v in sorted(value.analysis.items()))
        return text
    if stage == "plan":
        return "\n".join(f"{f}: {_plain(getattr(value, f))}" for f in
                         ("kernel_name", "arg_names", "adjoint_args", "written", "read",
                          "returns_value")) + \
            f"\nadjoint arguments: {', '.join(value.adjoint_names())}\n"
    if stage == "facts":
        return _facts_text(value)
    sources = value.sources()
    if len(sources) == 1:
        return sources["adjoint"]
    return "".join(f"# ---- {form} ----\n{src}\n" for form, src in sources.items())


def _plain(v):
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(sorted(map(str, v))) + "}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_plain(x)}" for k, x in sorted(v.items())) + "}"
    return str(v)


def _region_text(kernel):
    try:
        from . import dump
        return dump.region(kernel)
    except (ImportError, AttributeError):
        return f"kernel {kernel.name}({', '.join(kernel.args)}):\n" + \
            (ir.fmt(kernel.body, 1) or "    pass") + "\n"


def _facts_text(facts):
    try:
        from . import dump
        return dump.facts(facts)
    except (ImportError, AttributeError):
        fields = getattr(facts, "__dataclass_fields__", {})
        return "".join(f"{f}: {_plain(getattr(facts, f))}\n" for f in fields
                       if f != "kernel")


def _adjoint_ir_text(target, kernel, arg_types, wrt, options):
    """Every adjoint IR the target's writer builds (each form), before printing."""
    try:
        from . import adj_ir
    except ImportError:
        adj_ir = None
    if adj_ir is None or not hasattr(adj_ir, "capture"):
        return ("the adjoint-ir stage is not available in this version of kadj "
                "(the reverse pass writes source directly); use --stage source\n")
    with adj_ir.capture() as seen:
        stages(target, kernel, arg_types, wrt, options, until="source")
    return "".join(f"# ---- {form} ----\n{adj_ir.dump(fn)}\n" for form, fn in seen)
