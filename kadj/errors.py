"""Errors raised by kadj.

:class:`DifferentiationError` is for what the user can act on: it names the
kernel, the source file and line (with the source excerpt), the construct, and
what to do about it.  :class:`InternalError` is a broken invariant of kadj's
own and asks for a bug report.
"""
from __future__ import annotations


class DifferentiationError(Exception):
    """A construct in a kernel that kadj cannot differentiate.

    The message is a full sentence: the kernel, ``file:line`` with the source
    excerpt, the construct, and a remedy.
    """

    def __init__(self, message, *, kernel=None, loc=None, construct=None, remedy=None):
        self.kernel = kernel
        self.loc = loc
        self.construct = construct
        self.remedy = remedy
        parts = []
        if kernel is not None:
            parts.append(f"kadj cannot differentiate kernel '{kernel}'")
        if loc is not None:
            parts.append(f"at {_where(loc)}")
        head = " ".join(parts)
        text = message if not head else f"{head}: {message}"
        if construct is not None and construct not in text:
            text += f" (construct: {construct})"
        if remedy:
            text += f"\nWhat you can do: {remedy}"
        if loc is not None:
            excerpt = _excerpt(loc)
            if excerpt:
                text += "\n" + excerpt
        super().__init__(text)


class InternalError(Exception):
    """A broken invariant inside kadj: please report it as a bug."""

    def __init__(self, message):
        super().__init__(
            f"kadj internal error: {message}\nThis is a bug in kadj; please report it "
            "with the kernel that triggered it."
        )


def _where(loc):
    filename = getattr(loc, "filename", None) or "<unknown>"
    line = getattr(loc, "line", None)
    return f"{filename}:{line}" if line is not None else filename


def _excerpt(loc):
    try:
        return loc.strformat(nlines_up=1)
    except Exception:  # a location without readable source
        return ""
