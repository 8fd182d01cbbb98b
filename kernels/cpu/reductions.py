"""Reductions returning a float, and normalisations: dot, norms, softmax, losses."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._example import Example


@njit
def dot(x, y):
    """Inner product."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


def dot_args(rng):
    return rng.standard_normal(30), rng.standard_normal(30)


def dot_f32_args(rng):
    x, y = dot_args(rng)
    return x.astype(np.float32), y.astype(np.float32)


@njit
def l2_norm(x):
    """Euclidean norm."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return math.sqrt(s)


def l2_norm_args(rng):
    return (rng.standard_normal(25),)


@njit
def softmax(x, out):
    """Softmax with max subtraction for stability; the max found by a branch."""
    n = x.shape[0]
    m = x[0]
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
    s = 0.0
    for i in range(n):
        out[i] = math.exp(x[i] - m)
        s += out[i]
    for i in range(n):
        out[i] /= s


def softmax_args(rng):
    return rng.standard_normal(12) * 2.0, np.zeros(12)


def softmax_f32_args(rng):
    x, out = softmax_args(rng)
    return x.astype(np.float32), out.astype(np.float32)


@njit
def logsumexp(x):
    """log(sum(exp(x))) with max subtraction, using max()."""
    m = x[0]
    for i in range(1, x.shape[0]):
        m = max(m, x[i])
    s = 0.0
    for i in range(x.shape[0]):
        s += np.exp(x[i] - m)
    return m + np.log(s)


def logsumexp_args(rng):
    return (rng.standard_normal(20) * 3.0,)


@njit
def _huber(r, delta):
    if abs(r) <= delta:
        return 0.5 * r * r
    return delta * (abs(r) - 0.5 * delta)


@njit
def huber_loss(pred, target, delta):
    """Mean Huber loss; the quadratic/linear branch in a helper."""
    total = 0.0
    n = pred.shape[0]
    for i in range(n):
        total += _huber(pred[i] - target[i], delta)
    return total / n


def huber_loss_args(rng):
    # Residuals with |r| in [0.05, 0.8] or [1.2, 3]: away from 0 and from delta=1.
    n = 20
    mag = np.where(rng.random(n) < 0.5, rng.uniform(0.05, 0.8, n), rng.uniform(1.2, 3.0, n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    target = rng.standard_normal(n)
    return target + sign * mag, target, 1.0


@njit
def gaussian_nll(x, mu, log_sigma):
    """Negative log-likelihood of samples x under N(mu, exp(log_sigma)^2)."""
    sigma = math.exp(log_sigma)
    total = 0.0
    for i in range(x.shape[0]):
        z = (x[i] - mu) / sigma
        total += 0.5 * z * z + log_sigma + 0.5 * math.log(2.0 * math.pi)
    return total


def gaussian_nll_args(rng):
    return rng.standard_normal(16) + 0.5, 0.3, -0.2


@njit
def weighted_variance(x, w):
    """Weighted variance, two passes (mean first)."""
    sw = 0.0
    swx = 0.0
    for i in range(x.shape[0]):
        sw += w[i]
        swx += w[i] * x[i]
    mean = swx / sw
    acc = 0.0
    for i in range(x.shape[0]):
        d = x[i] - mean
        acc += w[i] * d * d
    return acc / sw


def weighted_variance_args(rng):
    return rng.standard_normal(14), rng.uniform(0.2, 1.0, 14)


@njit
def logistic_loss(logits, labels):
    """Binary cross-entropy from logits, the stable form branching on the sign."""
    total = 0.0
    for i in range(logits.shape[0]):
        z = logits[i]
        if z >= 0.0:
            total += math.log1p(math.exp(-z)) + z - labels[i] * z
        else:
            total += math.log1p(math.exp(z)) - labels[i] * z
    return total


def logistic_loss_args(rng):
    sign = np.where(rng.random(18) < 0.5, -1.0, 1.0)
    return sign * rng.uniform(0.1, 3.0, 18), (rng.random(18) < 0.5).astype(np.float64)


@njit
def mse_loss_into(u, target, loss):
    """Mean squared error written into a 1-element array (the Tape's loss pattern)."""
    n = u.shape[0]
    acc = 0.0
    for i in range(n):
        d = u[i] - target[i]
        acc += d * d
    loss[0] = acc / n


def mse_loss_into_args(rng):
    return rng.standard_normal(20), rng.standard_normal(20), np.zeros(1)


EXAMPLES = [
    Example("dot", dot, dot_args, tags=("reduction", "returns")),
    Example("dot_f32", dot, dot_f32_args, tags=("reduction", "returns", "float32")),
    Example("l2_norm", l2_norm, l2_norm_args, tags=("reduction", "returns")),
    Example("softmax", softmax, softmax_args, tags=("branch", "inplace")),
    Example("softmax_f32", softmax, softmax_f32_args, tags=("branch", "float32")),
    Example("mse_loss_into", mse_loss_into, mse_loss_into_args, tags=("reduction",)),
    Example("logsumexp", logsumexp, logsumexp_args, tags=("reduction", "returns")),
    Example("huber_loss", huber_loss, huber_loss_args,
            tags=("reduction", "returns", "branch", "helper")),
    Example("gaussian_nll", gaussian_nll, gaussian_nll_args,
            tags=("reduction", "returns")),
    Example("weighted_variance", weighted_variance, weighted_variance_args,
            tags=("reduction", "returns")),
    Example("logistic_loss", logistic_loss, logistic_loss_args,
            wrt=("logits",), tags=("reduction", "returns", "branch", "wrt")),
]
