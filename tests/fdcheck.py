"""An independent finite-difference reference for the construct tests.

``fd_check(k, args)`` builds the full vector-Jacobian product by float64 central
differences of the undecorated kernel (on copies of the arguments) and compares it with
``k.adjoint`` called per API.md's in/out rule.
"""
import numpy as np


def _outputs(k, args, plan):
    cp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    ret = k.forward(*cp)
    outs = [cp[i] for i in sorted(plan.written) if np.issubdtype(cp[i].dtype, np.floating)]
    if plan.returns_value:
        outs.append(np.array([ret], dtype=np.float64))
    return outs, ret


def fd_check(k, args, rtol=1e-6, atol=1e-9, eps=1e-6, seed=0):
    rng = np.random.default_rng(seed)
    args = list(args)
    plan = k.adjoint_plan(*args)
    outs, _ = _outputs(k, args, plan)
    cts = [rng.standard_normal(o.shape).astype(o.dtype) for o in outs]
    written = [i for i in sorted(plan.written) if np.issubdtype(args[i].dtype, np.floating)]
    ct_of = dict(zip(written, cts))
    ct_ret = float(cts[-1][0]) if plan.returns_value else None

    def f(xargs):
        o, _ = _outputs(k, xargs, plan)
        return sum(float(np.sum(c.astype(np.float64) * oo.astype(np.float64)))
                   for c, oo in zip(cts, o))

    bufs = []
    for i in plan.adjoint_args:
        x = args[i]
        if isinstance(x, np.ndarray):
            bufs.append(ct_of[i].copy() if i in ct_of else np.zeros_like(x))
        else:
            bufs.append(np.zeros(1, dtype=np.asarray(x).dtype))
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kw = {"adj_return": ct_ret} if plan.returns_value else {}
    k.adjoint(*args, *bufs, **kw)
    for b, a in zip(before, args):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg="adjoint modified a forward argument")
    for slot, i in enumerate(plan.adjoint_args):
        x = args[i]
        if isinstance(x, np.ndarray):
            ref = np.zeros(x.shape)
            for idx in np.ndindex(x.shape):
                xp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                xm = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                h = eps * max(1.0, abs(float(x[idx])))
                xp[i][idx] += h
                xm[i][idx] -= h
                ref[idx] = (f(xp) - f(xm)) / (2 * h)
            got = bufs[slot].astype(np.float64)
        else:
            h = eps * max(1.0, abs(float(x)))
            xp = list(args); xp[i] = x + h
            xm = list(args); xm[i] = x - h
            ref = np.array([(f(xp) - f(xm)) / (2 * h)])
            got = bufs[slot].astype(np.float64)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {plan.arg_names[i]} in {k.__name__}")
    return bufs
