"""Failure messages of the gradient checks.

When a disagreement is confirmed, names the kernel, the argument and, for small
arguments, the elements (or Jacobian entries) whose gradient differs, with the
adjoint's and the finite differences' values; elements that look like kinks or
ties are reported apart, with their one-sided derivatives and whether the adjoint's
value is one of them.  Locating the elements runs more probes, one per element.
"""
from __future__ import annotations

import numpy as np

from .probes import _REFINE, _confirmed, _rss, _unit
from .problem import _element_name, _index_name

_SHOWN = 8          # elements listed in a failure message


def _mismatch_text(problem, point, s, ct, g, verdict, tol, explain_max):
    first, second = verdict.first, verdict.second
    fd, ad = float(first.fd[0]), float(first.ad[0])
    return (f"<adjoint(ct), d> = {ad!r} but central finite differences give "
            f"<ct, J d> = {fd!r}, difference {abs(ad - fd):.3g} > tolerance "
            f"{float(first.allowed[0]):.3g}; a {_REFINE:g}x smaller step confirms it "
            f"({float(second.fd[0])!r}) (outputs: {_names(problem.outputs)}). "
            + _explain(problem, point, s, ct, g, verdict, tol, explain_max))


def _explain(problem, point, s, ct, g, verdict, tol, explain_max):
    """Which elements of ``s`` disagree, and which look like kinks, as text."""
    c0 = np.array([ct @ point.y0])
    f0_abs = _rss(ct[None, :], point.y0)
    size = s.stop - s.start
    if size > explain_max:
        if verdict.kinks(c0, f0_abs)[0]:
            where = (f"along a random direction in '{s.name}' ({size} elements, more "
                     f"than explain_max={explain_max}, so the element is not located)")
            return _kink_text(s, [(where, *verdict.kink_values(c0, 0))])
        return (f"'{s.name}' has {size} elements, more than explain_max={explain_max}: "
                "the elements that differ are not located.")
    kinks, wrong = [], []
    for k in range(size):
        j = s.start + k
        element = _confirmed(problem, point, _unit(problem, j), point.steps[j],
                             ct[None, :], g[None, :], tol, _index_name(s, k))
        if element.agrees[0]:
            continue
        if element.kinks(c0, f0_abs)[0]:
            kinks.append((_index_name(s, k), *element.kink_values(c0, 0)))
        else:
            wrong.append((abs(float(element.ad[0] - element.fd[0])), _index_name(s, k),
                          float(element.ad[0]), float(element.fd[0])))
    text = _wrong_text(s, wrong, size)
    if kinks:
        text = (text + " " if wrong else "") + _kink_text(s, kinks)
    if not text:
        text = (f"Element by element, the gradient of '{s.name}' agrees with finite "
                "differences (the mismatch is spread over many small errors).")
    return text


def _wrong_text(s, wrong, size):
    if not wrong:
        return ""
    wrong.sort(key=lambda w: -w[0])
    shown = wrong[:_SHOWN]
    more = f" (showing {len(shown)})" if len(wrong) > len(shown) else ""
    items = "; ".join(f"{where}: adjoint {ad:.8g}, finite differences {fd:.8g}"
                      for _, where, ad, fd in shown)
    return (f"Gradient of '{s.name}' for this cotangent differs at {len(wrong)} of "
            f"{size} element(s){more}: {items}.")


def _kink_text(s, kinks):
    """``kinks``: (where, forward slope, backward slope, adjoint, adjoint is one of
    them)."""
    shown = kinks[:_SHOWN]
    one_of = all(k[4] for k in shown)
    items = "; ".join(
        f"{where}: one-sided derivatives {fwd:.6g} (forward) and {bwd:.6g} "
        f"(backward), adjoint {ad:.6g}"
        + ("" if one_of else (" (one of them)" if match else " (neither)"))
        for where, fwd, bwd, ad, match in shown)
    more = f" (showing {len(shown)} of {len(kinks)})" if len(kinks) > len(shown) else ""
    verdict = ("the adjoint's value is one of the one-sided derivatives" if one_of else
               "the adjoint's value is not always one of the one-sided derivatives")
    return (f"The function looks non-differentiable (a kink or tie) near this point; "
            f"{verdict}{more}: {items}. Finite differences cannot check a gradient "
            f"there: check at a point away from kinks and ties (other values of "
            f"'{s.name}'), or leave '{s.name}' out with wrt.")


def _jacobian_failure(problem, point, cts, unit_rows, failures):
    """Raise for the first input argument with disagreeing columns."""
    c0, f0_abs = cts @ point.y0, _rss(cts, point.y0)
    j0 = failures[0][0]
    s_in = next(s for s in problem.inputs if s.start <= j0 < s.stop)
    kinks, wrong, blocks = [], [], []
    for j, verdict in failures:
        if not s_in.start <= j < s_in.stop:
            continue
        kinky = verdict.kinks(c0, f0_abs)
        for r in np.nonzero(~verdict.agrees)[0]:
            out = _row_name(problem, r, unit_rows)
            where = f"d({out} after)/d({_element_name(problem, j)} before)"
            if kinky[r]:
                kinks.append((where, *verdict.kink_values(c0, r)))
            else:
                wrong.append((abs(float(verdict.ad[r] - verdict.fd[r])), where,
                              float(verdict.ad[r]), float(verdict.fd[r]),
                              float(verdict.allowed[r])))
            block = _row_block(problem, r, unit_rows)
            if block not in blocks:
                blocks.append(block)
    what = ", ".join(f"d({b} after)/d({s_in.name} before)" for b in blocks)
    text = (f"The adjoint of kernel '{problem.name}' disagrees with central finite "
            f"differences in {what} (argument '{s_in.name}'), confirmed with a "
            f"{_REFINE:g}x smaller step.")
    if wrong:
        wrong.sort(key=lambda w: -w[0])
        shown = wrong[:_SHOWN]
        more = f", showing {len(shown)}" if len(wrong) > len(shown) else ""
        text += (f" {len(wrong)} entr{'y differs' if len(wrong) == 1 else 'ies differ'}"
                 f"{more}: " + "; ".join(
                     f"{where}: adjoint {ad:.8g}, finite differences {fd:.8g} "
                     f"(difference {diff:.3g} > tolerance {allowed:.3g})"
                     for diff, where, ad, fd, allowed in shown) + ".")
    if kinks:
        text += " " + _kink_text(s_in, kinks)
    raise AssertionError(text)


def _row_name(problem, r, unit_rows):
    if not unit_rows:
        return f"random cotangent {r}"
    for s in problem.outputs:
        if s.start <= r < s.stop:
            return _index_name(s, r - s.start) if s.index >= 0 else s.name
    raise IndexError(r)


def _row_block(problem, r, unit_rows):
    if not unit_rows:
        return "random cotangents"
    return next(s.name for s in problem.outputs if s.start <= r < s.stop)


def _names(slots):
    return ", ".join(s.name for s in slots)
