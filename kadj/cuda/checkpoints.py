"""The CUDA part of reversing loops from checkpoints (:mod:`kadj.checkpoint_reverse`).

Besides the loop's carried scalars and the thread's local scratch arrays, a CUDA
thread checkpoints its own element of the shared arrays the loop rewrites (analysis
``owned_shared``): :func:`own_element` says which element that is, from the index of
the kernel's store into the array (:mod:`kadj.cuda.indexing`).  The block meets at a
barrier around restoring them, since other threads read them.  Replayed iterations
execute their stores into local arrays and into the shared tiles the loop rewrites.
Slots are local arrays (:class:`kadj.adj_ir.LocalArray`, ``cuda.local.array``).
"""
from __future__ import annotations

from .cells import owned_shared


def own_element(w, name):
    """[(kind, value)] of the running thread's own element of shared array ``name``:
    the index of the kernel's stores into it inside loops, in the block's local
    coordinates (:func:`kadj.cuda.cells.owned_shared`)."""
    return owned_shared(w.k, {name}, w.state.index).get(name)
