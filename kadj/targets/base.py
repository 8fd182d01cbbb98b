"""What a target is, and the values its stages hand to the pipeline.

A :class:`Target` is a frozen description: which dispatchers it differentiates, how it
types and structures a kernel, how it prepares the region tree for the analysis, how it
writes, compiles and reloads the adjoint, which ``differentiate`` options it takes, and
its tape and accumulation policies.  :mod:`kadj.pipeline` runs the same stages for every
target through these functions; nothing there depends on which target it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

TAPE_POLICIES = ("growable", "bounded")
DEFAULT_CHECKPOINTS = 24     # checkpoint slots per loop when checkpoints=True


def checkpoint_slots(value):
    """The number of checkpoint slots that ``checkpoints=value`` asks for: a positive
    int, or True for the default (:data:`DEFAULT_CHECKPOINTS`)."""
    if value is True:
        return DEFAULT_CHECKPOINTS
    try:
        slots = int(value)
    except (TypeError, ValueError):
        slots = 0
    if value is False or slots < 1 or slots != value:
        raise ValueError("checkpoints must be a positive number of slots (or True for "
                         f"the default, {DEFAULT_CHECKPOINTS}), not {value!r}")
    return slots


@dataclass(frozen=True)
class Intrinsics:
    """How a target's intrinsics appear in the adjoint's source.

    name:   object -> the text naming that callable intrinsic (``cuda.grid``), or None
            for an object that is not one of the target's intrinsics.
    value:  callable of an ``Op`` -> the text of that intrinsic read as a value, without
            a call (a special register: ``cuda.threadIdx.x``), or None.
    """

    name: Callable
    value: Callable


@dataclass(frozen=True)
class Target:
    """One target's description (see the module docstring).

    name:           "cpu", "cuda", ... (also the target part of the disk-cache key).
    title:          how messages name its kernels ("CUDA kernels cannot return values").
    recognises:     dispatcher -> bool: is this a kernel of this target?
    kernel_class:   "module:Class" of the differentiated-kernel object, loaded on first
                    use (descriptions import no kernel class: no import cycle).
    typeof:         (dispatcher, value) -> numba type of one argument.
    jit_options:    dispatcher -> the user's compiler options the adjoint keeps.
    type_kernel:    (dispatcher, arg_types) -> :class:`kadj.frontend.TypedKernel`.
    structurize:    typed kernel -> region tree (:class:`kadj.ir.Kernel`).
    prepare:        (region tree, plan) -> :class:`Prepared` (target rewrites, memory
                    spaces, the analysis' policy keyword arguments).
    write:          (prepared, facts, plan, options) -> :class:`Written`; ``options``
                    also holds ``jit_options``, the compiler options the adjoint is
                    compiled with (for functions its source defines besides it).
    compile:        (written, plan, typed, key, jit_options, options) -> compiled adjoint.
    load:           (key, request) -> the compiled adjoint from the disk cache, or None.
    options:        the ``differentiate`` options it supports besides ``wrt``, with
                    their defaults; any other option given is refused.
    check_option:   (kernel name, option, value) -> the value to use (may refuse).
    returns_values: may a kernel return a float (the loss)?
    tape:           "growable" (a heap tape that grows) or "bounded" (per-thread slots).
    accumulation:   how adjoint contributions are added ("plain", "atomic", ...).
    intrinsics:     an :class:`Intrinsics` table, or None (no intrinsics).
    policy:         options -> further keyword arguments of the analysis (a CPU
                    kernel's ``checkpoints=`` asks for loops that carry state to be
                    reversed from checkpoints: ``carried_replay``).
    write_tangent:  forward mode (``kernel.jvp``): (prepared, facts, plan) -> the
                    tangent's :class:`kadj.reverse.AdjointSource`; None: the host's
                    (:mod:`kadj.tangent`), for CPU kernels only.
    compile_tangent: (plan, source, Python function, disk_cached, jit_options) -> the
                    compiled tangent (with ``write_tangent``).
    """

    name: str
    title: str
    recognises: Callable
    kernel_class: str
    typeof: Callable
    jit_options: Callable
    type_kernel: Callable
    structurize: Callable
    prepare: Callable
    write: Callable
    compile: Callable
    load: Callable
    options: Mapping = field(default_factory=dict)
    check_option: Callable = None
    returns_values: bool = True
    tape: str = "growable"
    accumulation: str = "plain"
    policy: Callable = None
    intrinsics: Intrinsics = None
    write_tangent: Callable = None
    compile_tangent: Callable = None

    def __post_init__(self):
        if self.tape not in TAPE_POLICIES:
            raise ValueError(f"tape policy must be one of {TAPE_POLICIES}, not {self.tape!r}")

    def supports(self, option):
        return option == "wrt" or option in self.options


@dataclass(frozen=True)
class Request:
    """What one adjoint is built for: the kernel, its argument types, ``wrt``, the
    target's options (defaults filled in) and the kept compiler options."""

    dispatcher: object
    arg_types: tuple
    wrt: tuple = None
    options: Mapping = field(default_factory=dict)
    jit_options: Mapping = field(default_factory=dict)

    @property
    def py_func(self):
        return self.dispatcher.py_func

    @property
    def name(self):
        return self.py_func.__name__

    @property
    def arg_names(self):
        code = self.py_func.__code__
        return tuple(code.co_varnames[:code.co_argcount])


@dataclass(frozen=True)
class Prepared:
    """The region tree after the target's preparation rewrites, and the keyword
    arguments of :func:`kadj.analysis.analyze` that carry the target's policies."""

    kernel: object
    analysis: Mapping = field(default_factory=dict)
    extra: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Written:
    """The adjoint's source: the main adjoint (:class:`kadj.reverse.AdjointSource`),
    other forms by name, the adjoint report and what the compiled adjoint needs."""

    adjoint: object
    forms: Mapping = field(default_factory=dict)
    report: object = None
    extra: Mapping = field(default_factory=dict)

    def sources(self):
        """{form: source text}, the main adjoint as "adjoint"."""
        out = {"adjoint": self.adjoint.source}
        out.update((k, v.source) for k, v in self.forms.items())
        return out


@dataclass(frozen=True)
class CompiledAdjoint:
    """A compiled adjoint of a host (CPU) kernel.  ``memory``: the
    :class:`kadj.call_memory.KeptMemory` its calls take their arrays from (the
    arguments to append after its own), or None when it allocates nothing once per
    call."""

    plan: object
    source: str
    function: object       # the jitted adjoint
    disk_cached: bool
    memory: object = None

    def fresh_memory(self):
        """The arguments after the adjoint's own that make every array it allocates
        new memory of exactly its size (a call that keeps nothing)."""
        return [] if self.memory is None else self.memory.fresh()
