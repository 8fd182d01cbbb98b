"""Shapes for the galleries' sized argument makers (kernels.cpu, kernels.cuda)."""
from __future__ import annotations

import math


def at_least(n, smallest):
    """``n`` as an int, raised to ``smallest``."""
    return max(int(n), int(smallest))


def grid2(n, smallest=3):
    """(rows, cols) of a 2-D grid with about ``n`` cells, the axes unequal and both
    near sqrt(n)."""
    rows = at_least(round(math.sqrt(max(n, 1))), smallest)
    cols = at_least(-(-int(n) // rows), smallest)
    if cols == rows:
        cols += 1
    return rows, cols


def grid3(n, smallest=3):
    """(nx, ny, nz) of a 3-D grid with about ``n`` cells, the axes unequal."""
    a = at_least(round(max(n, 1) ** (1.0 / 3.0)), smallest)
    nz = at_least(-(-int(n) // (a * (a + 1))), smallest)
    if nz in (a, a + 1):
        nz = a + 2
    return a, a + 1, nz


def pairs_to_points(n, smallest=2):
    """Number of points whose pairs number about ``n``."""
    return at_least(round(math.sqrt(2.0 * max(n, 1))), smallest)
