"""Target descriptions and their registry.

A target (:class:`Target`, frozen) describes how kadj differentiates the kernels of one
numba target: its dispatcher, typing, structuring and preparation functions, writer,
compile and disk-cache functions, the ``differentiate`` options it supports, its tape
policy ("growable" heap tape or "bounded" per-thread slots) and its accumulation policy.
:mod:`kadj.pipeline` runs the same stages for each; the two built-in targets are
:data:`kadj.targets.cpu.CPU` and :data:`kadj.targets.cuda.CUDA`.

    >>> kadj.targets.for_dispatcher(my_njit_kernel).name
    'cpu'
"""
from __future__ import annotations

import importlib

from .base import CompiledAdjoint, Prepared, Request, Target, Written  # noqa: F401
from .cpu import CPU
from .cuda import CUDA

_REGISTRY = {}


def register(target):
    """Add ``target`` (a :class:`Target`); a later one with the same name replaces it.
    Dispatchers are matched against the most recently registered targets first."""
    _REGISTRY.pop(target.name, None)
    _REGISTRY[target.name] = target
    return target


def get(name):
    """The registered target called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LookupError(f"no kadj target named {name!r}; known: "
                          f"{', '.join(sorted(_REGISTRY))}") from None


def names():
    return tuple(_REGISTRY)


def for_dispatcher(dispatcher):
    """The target whose kernels ``dispatcher`` belongs to, or None."""
    for target in reversed(list(_REGISTRY.values())):
        if target.recognises(dispatcher):
            return target
    return None


def kernel_class(target):
    """The differentiated-kernel class of ``target`` (named by its description)."""
    module, _, qualname = target.kernel_class.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


register(CPU)
register(CUDA)
