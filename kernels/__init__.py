"""kadj's gallery of example kernels.

``kernels.cpu`` holds realistic ``@njit`` kernels (stencils, recurrences, sparse
operations, reductions, small physics and machine-learning pieces), each with
a function that makes small example arguments.  They are written the way a
scientist writes a Numba kernel, *not* decorated by kadj: the gallery tests
apply :func:`kadj.differentiate` themselves and check the forward result and
the gradient against finite differences.
"""
