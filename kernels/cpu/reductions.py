"""Reductions returning a float, and normalisations: dot, norms, softmax, losses."""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._example import Example
from ..sizes import at_least


@njit
def dot(x, y):
    """Inner product."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


def dot_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.standard_normal(n)


def dot_args(rng):
    return dot_sized(rng, 30)


def dot_f32_sized(rng, n):
    x, y = dot_sized(rng, n)
    return x.astype(np.float32), y.astype(np.float32)


def dot_f32_args(rng):
    return dot_f32_sized(rng, 30)


@njit
def l2_norm(x):
    """Euclidean norm."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return math.sqrt(s)


def l2_norm_sized(rng, n):
    return (rng.standard_normal(at_least(n, 1)),)


def l2_norm_args(rng):
    return l2_norm_sized(rng, 25)


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


def softmax_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n) * 2.0, np.zeros(n)


def softmax_args(rng):
    return softmax_sized(rng, 12)


def softmax_f32_sized(rng, n):
    x, out = softmax_sized(rng, n)
    return x.astype(np.float32), out.astype(np.float32)


def softmax_f32_args(rng):
    return softmax_f32_sized(rng, 12)


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


def logsumexp_sized(rng, n):
    return (rng.standard_normal(at_least(n, 1)) * 3.0,)


def logsumexp_args(rng):
    return logsumexp_sized(rng, 20)


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


def huber_loss_sized(rng, n):
    # Residuals with |r| in [0.05, 0.8] or [1.2, 3]: away from 0 and from delta=1.
    n = at_least(n, 1)
    mag = np.where(rng.random(n) < 0.5, rng.uniform(0.05, 0.8, n), rng.uniform(1.2, 3.0, n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    target = rng.standard_normal(n)
    return target + sign * mag, target, 1.0


def huber_loss_args(rng):
    return huber_loss_sized(rng, 20)


@njit
def gaussian_nll(x, mu, log_sigma):
    """Negative log-likelihood of samples x under N(mu, exp(log_sigma)^2)."""
    sigma = math.exp(log_sigma)
    total = 0.0
    for i in range(x.shape[0]):
        z = (x[i] - mu) / sigma
        total += 0.5 * z * z + log_sigma + 0.5 * math.log(2.0 * math.pi)
    return total


def gaussian_nll_sized(rng, n):
    return rng.standard_normal(at_least(n, 1)) + 0.5, 0.3, -0.2


def gaussian_nll_args(rng):
    return gaussian_nll_sized(rng, 16)


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


def weighted_variance_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.uniform(0.2, 1.0, n)


def weighted_variance_args(rng):
    return weighted_variance_sized(rng, 14)


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


def logistic_loss_sized(rng, n):
    n = at_least(n, 1)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return sign * rng.uniform(0.1, 3.0, n), (rng.random(n) < 0.5).astype(np.float64)


def logistic_loss_args(rng):
    return logistic_loss_sized(rng, 18)


@njit
def mse_loss_into(u, target, loss):
    """Mean squared error written into a 1-element array (the Tape's loss pattern)."""
    n = u.shape[0]
    acc = 0.0
    for i in range(n):
        d = u[i] - target[i]
        acc += d * d
    loss[0] = acc / n


def mse_loss_into_sized(rng, n):
    n = at_least(n, 1)
    return rng.standard_normal(n), rng.standard_normal(n), np.zeros(1)


def mse_loss_into_args(rng):
    return mse_loss_into_sized(rng, 20)


@njit
def softmax_cross_entropy(logits, labels):
    """Mean cross-entropy of softmax(logits[b]) against integer labels; each row's
    softmax is written into a scratch row first (max-shifted, the max by a branch)."""
    batch, classes = logits.shape
    p = np.empty(classes)
    total = 0.0
    for b in range(batch):
        m = logits[b, 0]
        for j in range(1, classes):
            if logits[b, j] > m:
                m = logits[b, j]
        s = 0.0
        for j in range(classes):
            p[j] = math.exp(logits[b, j] - m)
            s += p[j]
        for j in range(classes):
            p[j] /= s
        total -= math.log(p[labels[b]])
    return total / batch


def softmax_cross_entropy_shaped(rng, batch, classes):
    """(batch, classes) logits with distinct entries per row, labels in range."""
    batch, classes = at_least(batch, 1), at_least(classes, 1)
    logits = rng.standard_normal((batch, classes)) * 2.0
    return logits, rng.integers(0, classes, batch).astype(np.int64)


def softmax_cross_entropy_sized(rng, n):
    """n samples of 17 classes."""
    return softmax_cross_entropy_shaped(rng, n, 17)


def softmax_cross_entropy_args(rng):
    return softmax_cross_entropy_shaped(rng, 5, 6)


@njit
def softmax_rows_inplace(x):
    """Softmax of every row of a matrix, written over the row in place (max-shifted,
    the max by a branch)."""
    nrows, ncols = x.shape
    for r in range(nrows):
        m = x[r, 0]
        for j in range(1, ncols):
            if x[r, j] > m:
                m = x[r, j]
        s = 0.0
        for j in range(ncols):
            x[r, j] = math.exp(x[r, j] - m)
            s += x[r, j]
        for j in range(ncols):
            x[r, j] /= s


@njit
def softmax_rows(x, out):
    """Softmax of every row of a matrix into another matrix (the out-of-place twin of
    softmax_rows_inplace)."""
    nrows, ncols = x.shape
    for r in range(nrows):
        m = x[r, 0]
        for j in range(1, ncols):
            if x[r, j] > m:
                m = x[r, j]
        s = 0.0
        for j in range(ncols):
            out[r, j] = math.exp(x[r, j] - m)
            s += out[r, j]
        for j in range(ncols):
            out[r, j] /= s


def softmax_rows_shaped(rng, rows, cols):
    """(rows, cols) logits with distinct entries per row (no ties for the max)."""
    return rng.standard_normal((at_least(rows, 1), at_least(cols, 1))) * 2.0


def softmax_rows_inplace_sized(rng, n):
    """n rows of 8."""
    return (softmax_rows_shaped(rng, n, 8),)


def softmax_rows_inplace_args(rng):
    return (softmax_rows_shaped(rng, 5, 7),)


def softmax_rows_sized(rng, n):
    """n rows of 8."""
    x = softmax_rows_shaped(rng, n, 8)
    return x, np.zeros_like(x)


def softmax_rows_args(rng):
    x = softmax_rows_shaped(rng, 5, 7)
    return x, np.zeros_like(x)


EXAMPLES = [
    Example("dot", dot, dot_args, tags=("reduction", "returns"),
            sized=dot_sized),
    Example("dot_f32", dot, dot_f32_args, tags=("reduction", "returns", "float32"),
            sized=dot_f32_sized),
    Example("l2_norm", l2_norm, l2_norm_args, tags=("reduction", "returns"),
            sized=l2_norm_sized),
    Example("softmax", softmax, softmax_args, tags=("branch", "inplace"),
            sized=softmax_sized),
    Example("softmax_f32", softmax, softmax_f32_args, tags=("branch", "float32"),
            sized=softmax_f32_sized),
    Example("softmax_rows_inplace", softmax_rows_inplace, softmax_rows_inplace_args,
            tags=("branch", "inplace", "2d"), sized=softmax_rows_inplace_sized),
    Example("softmax_rows", softmax_rows, softmax_rows_args, tags=("branch", "2d"),
            sized=softmax_rows_sized),
    Example("mse_loss_into", mse_loss_into, mse_loss_into_args, tags=("reduction",),
            sized=mse_loss_into_sized),
    Example("logsumexp", logsumexp, logsumexp_args, tags=("reduction", "returns"),
            sized=logsumexp_sized),
    Example("huber_loss", huber_loss, huber_loss_args,
            tags=("reduction", "returns", "branch", "helper"),
            sized=huber_loss_sized),
    Example("gaussian_nll", gaussian_nll, gaussian_nll_args,
            tags=("reduction", "returns"),
            sized=gaussian_nll_sized),
    Example("weighted_variance", weighted_variance, weighted_variance_args,
            tags=("reduction", "returns"),
            sized=weighted_variance_sized),
    Example("logistic_loss", logistic_loss, logistic_loss_args,
            wrt=("logits",), tags=("reduction", "returns", "branch", "wrt"),
            sized=logistic_loss_sized),
    Example("softmax_cross_entropy", softmax_cross_entropy, softmax_cross_entropy_args,
            tags=("reduction", "returns", "branch", "scratch", "2d", "int_args"),
            sized=softmax_cross_entropy_sized),
]
