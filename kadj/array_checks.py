"""Shape checks of lowered whole-array NumPy (:mod:`kadj.array_lowering`), called by
the generated code.

NumPy (and numba's forward) refuses operands whose shapes do not broadcast, a matrix
product whose inner dimensions differ and a slice assignment from a value of another
shape, with a ``ValueError``.  The element loops the lowering writes compute their
extents through these helpers, so that the adjoint refuses the same calls with a
``ValueError`` before any loop reads outside an operand or writes into an array."""
from __future__ import annotations

from .cachedir import cached_njit


@cached_njit(inline="always")
def stretch(x, n):
    """The index multiplier of an operand of extent ``x`` broadcast to extent ``n``
    (the result's, or the destination's): 0 for a stretched extent 1, 1 for the same
    extent; raises ``ValueError`` when ``x`` is neither 1 nor ``n``."""
    if x == 1:
        return 0
    if x == n:
        return 1
    raise ValueError("operands could not be broadcast together (or into the "
                     "destination): in one dimension an extent is neither 1 nor the "
                     "broadcast extent")


@cached_njit(inline="always")
def inner_extent(a, b):
    """The contracted extent of ``np.dot``/``@`` (``a``: the last dimension of the
    left operand, ``b``: the first of the right one); raises ``ValueError`` when they
    differ."""
    if a != b:
        raise ValueError("incompatible array sizes for np.dot(a, b) or a @ b: the "
                         "inner dimensions differ")
    return a


@cached_njit(inline="always")
def nonempty(n):
    """Extent ``n`` of an array that ``np.max``/``np.min`` reduce over; raises
    ``ValueError`` when it is 0, as NumPy does (the reduction has no identity)."""
    if n == 0:
        raise ValueError("zero-size array to reduction operation maximum or minimum "
                         "which has no identity")
    return n
