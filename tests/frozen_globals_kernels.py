"""Kernels reading module globals, for tests/test_frozen_globals.py (each test uses its
own kernel: numba keeps what it compiled for the whole process)."""
import numpy as np
from numba import njit

import kadj

DT = 0.01
W = np.array([1.0, 2.0, 3.0])
C = 2.0
K = 3.0


@njit
def _scaled(z):
    return K * z


@kadj.differentiate
@njit
def rebound(x, y):
    for i in range(x.shape[0]):
        y[i] = DT * x[i] * x[i]


@kadj.differentiate
@njit
def mutated(x, y):
    for i in range(x.shape[0]):
        y[i] = W[i] * x[i] * x[i]


@kadj.differentiate
@njit
def adjoint_first(x, y):
    for i in range(x.shape[0]):
        y[i] = C * x[i] * x[i]


@kadj.differentiate
@njit
def via_helper(x, y):
    for i in range(x.shape[0]):
        y[i] = _scaled(x[i] * x[i])


@kadj.differentiate
@njit
def on_a_tape(x, y):
    for i in range(x.shape[0]):
        y[i] = DT * np.sin(x[i])


@kadj.differentiate
@njit
def unchanged(x, y):
    for i in range(x.shape[0]):
        y[i] = DT * x[i] * x[i]
