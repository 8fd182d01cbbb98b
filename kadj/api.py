"""Public API: :func:`differentiate`, :func:`grad`, :func:`value_and_grad` and
:func:`register_adjoint`; the differentiated-kernel object is
:class:`kadj.kernel.DifferentiatedKernel` (re-exported here).

A differentiated kernel wraps a numba dispatcher.  Calling it runs the forward exactly
as the undecorated kernel (recorded on an active :class:`kadj.Tape`); ``.adjoint(...)``
runs the generated adjoint, compiled once per argument-type signature by
:mod:`kadj.pipeline` for the kernel's target (:mod:`kadj.targets`).
"""
from __future__ import annotations

import numpy as np

from . import aux_loss, rules, targets
from .errors import DifferentiationError
from .kernel import DifferentiatedKernel
from .targets.base import CompiledAdjoint  # noqa: F401  (re-exported)

__all__ = ["DifferentiatedKernel", "differentiate", "grad", "value_and_grad",
           "register_adjoint"]


# ---- decorators and functional API ---------------------------------------------------
def differentiate(kernel=None, wrt=None, checkpoints=None, gather=None, parallel=None):
    """Differentiate a numba kernel: ``@kadj.differentiate`` above ``@njit`` or
    ``@cuda.jit``.

    Also usable as ``kadj.differentiate(kernel, wrt=("u", "alpha"))`` and as
    ``@kadj.differentiate(wrt=(...))``.  ``checkpoints``: the number of checkpoint
    slots for loops that carry state from one iteration to the next (a per-element time
    loop ``for t in range(T): v = f(v)``, a recurrence); ``True`` for the default, 24.
    Reversing such a loop of n iterations then replays O(log n) forward iterations per
    reversed one while n <= 2**checkpoints, and its tape holds one iteration's values
    instead of n.  CUDA kernels always checkpoint such loops (default 24 slots per
    thread); CPU kernels do when ``checkpoints`` is given, and otherwise record every
    iteration on a tape that grows.  ``gather`` (stencils): use the gather form of the
    adjoint, each adjoint element collected once (on CUDA: no atomics on neighbour
    arrays, when the launch allows it; default True; on a CPU: a loop over the elements
    that vectorises).  On a CPU the default takes it where it is expected to be faster:
    a parallel stencil, or a serial 1-D or 2-D one whose iterations compute only sums
    and products (each element's pass recomputes its neighbours' iteration adjoints);
    True takes it wherever the kernel qualifies, False never.  ``parallel`` (CPU kernels): by default the reversed ``prange`` loops whose
    iterations are independent and write only their own adjoint elements (or sum into
    scalars) run in parallel; True also plain ``for`` loops of that kind; False keeps
    every loop serial.  An option the kernel's target does not support is refused
    (:class:`kadj.DifferentiationError`), never ignored.
    """
    options = {"checkpoints": checkpoints, "gather": gather, "parallel": parallel}
    if kernel is None:
        return lambda k: differentiate(k, wrt=wrt, **options)
    if isinstance(kernel, DifferentiatedKernel):
        if (wrt is None or tuple(wrt) == kernel.wrt) and \
                all(v is None or kernel.options.get(k) == v for k, v in options.items()):
            return kernel
        if wrt is None:
            wrt = kernel.wrt
        options = {k: (kernel.options.get(k) if v is None else v)
                   for k, v in options.items()}
        kernel = kernel.dispatcher
    target = targets.for_dispatcher(kernel)
    cls = DifferentiatedKernel if target is None else targets.kernel_class(target)
    return cls(kernel, wrt=wrt, **{k: v for k, v in options.items() if v is not None})


def register_adjoint(fn):
    """Register a derivative rule for ``fn`` (a jitted helper or any callable numba can
    compile), written in :mod:`kadj.ops`::

        @kadj.register_adjoint(my_softplus)
        def _(g, out, x):
            return (g * (1.0 - kadj.ops.exp(-out)),)

    The rule gets the incoming adjoint ``g``, the primal output ``out`` and the
    arguments, and returns one contribution per argument (``None`` for none).  A rule
    whose parameters cannot take ``fn``'s arguments is refused here, one returning the
    wrong number of contributions when a kernel first uses it.  Registering again
    replaces the rule, also in the adjoints of kernels already differentiated (they
    are rebuilt).
    """
    def deco(vjp):
        rules.register(fn, domain=(), name=getattr(fn, "__name__", "custom"),
                       arities=rules.arities_of(fn))(vjp)
        rules.CUSTOM[fn] = vjp
        return vjp
    return deco


_MEMO = "_kadj_transformed"


def _as_kernel(f):
    """``f`` itself when it is a differentiated kernel; else the kernel the transforms
    (grad, value_and_grad, jvp, hvp) made of the jitted function ``f`` before, kept on
    its dispatcher (so both are freed together), or a new one.  ``kadj.grad(f)(x)`` or
    ``kadj.jvp(f, ...)`` written inside an optimisation loop then reuse the compiled
    adjoints instead of loading them anew at every call (4-17 ms each, and numba never
    frees compiled code: memory grew by each call).  ``kadj.differentiate(f)`` itself
    makes a new kernel each time."""
    if isinstance(f, DifferentiatedKernel):
        return f
    made = getattr(f, "__dict__", {}).get(_MEMO)
    if made is None:
        made = differentiate(f)
        try:
            setattr(f, _MEMO, made)
        except (AttributeError, TypeError):
            pass
    return made


def value_and_grad(f, argnums=0, has_aux=False):
    """``value_and_grad(f, argnums)(*args) -> (f(*args), gradient(s))`` for an ``@njit``
    function returning a float (like ``jax.value_and_grad``).

    With ``has_aux=True``, ``f`` returns a pair ``(loss, aux)``: ``loss`` a float, the
    value differentiated, and ``aux`` anything numba returns (a float, an array, a
    tuple), not differentiated; the result is then ``((loss, aux), gradient(s))``.
    Array arguments are left as they were, as without ``has_aux``."""
    k = _as_kernel(f)
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    if not has_aux:
        def run(*args, **kwargs):
            args = k.complete_args(args, kwargs)   # defaults filled before the buffers
            return _value_and_grad(k, args, nums, single)
        return run

    def run_aux(*args, **kwargs):
        args = k.complete_args(args, kwargs)
        loss_kernel = aux_loss.kernel(k)       # refuses a target without return values
        _loss, aux = _aux_forward(k, args)
        value, grads = _value_and_grad(loss_kernel, args, nums, single)
        return (value, aux), grads

    return run_aux


def _aux_forward(k, args):
    """``(loss, aux)`` from a forward call of ``k`` on copies of the array arguments
    (the caller's arrays are left as they were)."""
    out = k.forward(*[np.copy(a) if isinstance(a, np.ndarray) else a for a in args])
    if not (isinstance(out, tuple) and len(out) == 2 and
            isinstance(out[0], (float, np.floating))):
        what = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise DifferentiationError(
            f"{k.__name__} returns {what}; with has_aux=True it must return a pair "
            "(loss, aux) whose loss is a float", kernel=k.__name__,
            construct="has_aux=True",
            remedy="return (loss, aux), with a tuple as aux for several values, or "
                   "leave out has_aux=True for a function that returns only the loss")
    return out


def argnum_indices(k, nums):
    """``nums`` (argument positions, negative ones from the end) as positions of
    ``k``'s arguments; IndexError for one out of range."""
    nargs = len(k.arg_names)
    for i in nums:
        if not -nargs <= i < nargs:
            raise IndexError(f"argnums {i} is out of range for {k.__name__}, which "
                             f"takes {nargs} arguments")
    return tuple(i % nargs for i in nums)


def _value_and_grad(k, args, nums, single):
    idx = argnum_indices(k, nums)
    comp = k.compiled(*args)
    plan = comp.plan
    if not plan.returns_value:
        raise DifferentiationError(
            f"{k.__name__} does not return a float, so it has no gradient",
            kernel=k.__name__, remedy="return the scalar loss from the function")
    for i in idx:
        if i not in plan.adjoint_args:
            raise DifferentiationError(
                f"argument {i} ('{k.arg_names[i]}') is not differentiable (not a float "
                "or not in wrt)", kernel=k.__name__)
    bufs = []
    for i in plan.adjoint_args:
        x = args[i]
        if isinstance(x, np.ndarray):
            bufs.append(np.zeros_like(x))
        else:
            bufs.append(np.zeros(1, dtype=np.asarray(x).dtype))
    k.raise_as_forward(plan, args)       # the adjoint does not check what f checks
    value = k.adjoint(*args, *bufs, adj_return=1.0)
    grads = []
    for i in idx:
        b = bufs[plan.adjoint_args.index(i)]
        grads.append(b if isinstance(args[i], np.ndarray) else b[0].item())
    return value, (grads[0] if single else tuple(grads))


def grad(f, argnums=0, has_aux=False):
    """``grad(f, argnums)(*args)``: gradient of an ``@njit`` function returning a float
    with respect to ``args[argnums]`` (a tuple of gradients for a tuple of argnums).
    With ``has_aux=True``, ``f`` returns ``(loss, aux)`` and the result is
    ``(gradient(s), aux)``, as in JAX."""
    vg = value_and_grad(f, argnums, has_aux=has_aux)

    def run(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return run
