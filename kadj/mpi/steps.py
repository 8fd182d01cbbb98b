"""Communicating operations as tape steps: a :class:`kadj.custom.CustomStep` that
carries its replay signature (:mod:`kadj.mpi.replay_check`), recorded on the active
tape or checkpointed loop like :func:`kadj.custom_step`, or just run without one."""
from __future__ import annotations

import numpy as np

from .. import arrays
from ..custom import CustomStep
from ..tape_threads import active
from . import replay_check

__all__ = ["CommStep", "run", "staged", "store"]


class CommStep(CustomStep):
    """A custom step whose forward and adjoint communicate."""

    mpi_signature = None


def run(comm_index, kind, forward, adjoint, reads, writes, name):
    """Run ``forward()`` and record it with ``adjoint`` on the active tape or loop;
    return what ``forward`` returns."""
    sig = replay_check.signature(comm_index, kind)
    recorder = active()
    if recorder is None:
        return forward()
    step = CommStep(forward, adjoint, reads, writes, name=name)
    step.mpi_signature = sig
    replay_check.note(recorder, sig)
    return recorder.record(step, step.arrays)


def staged(a):
    """``a``'s contents as a writable NumPy array: ``a`` itself for a NumPy array, a
    host copy of a device array (host staging: the MPI need not be CUDA-aware)."""
    if arrays.kind(a) == "host":
        return a
    return np.ascontiguousarray(arrays.to_host(a))


def store(a, h):
    """Write back the host copy ``h`` made by :func:`staged` into ``a``."""
    if h is not a:
        arrays.copy_into(a, h)
