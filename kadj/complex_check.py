"""Where complex values are refused: kernels of targets whose writers, lowerings and
tapes handle real values only (today every target but the CPU's and CUDA's), with the
kernel's name."""
from __future__ import annotations

from numba.core import types

from .errors import DifferentiationError

#: the targets that differentiate complex values (CUDA: a complex atomic accumulation
#: is two float atomics on the real and imaginary parts, kadj.cuda.lower)
COMPLEX_TARGETS = frozenset({"cpu", "cuda"})


def is_complex(t):
    """Whether ``t`` is a complex scalar type or an array of complex elements."""
    return isinstance(t, types.Complex) or isinstance(getattr(t, "dtype", None),
                                                      types.Complex)


def check_target(target, kernel, kernel_name):
    """Refuse a complex argument or value of a kernel whose target does not
    differentiate complex values."""
    if target.name in COMPLEX_TARGETS:
        return
    for name, t in kernel.types.items():
        if is_complex(t):
            raise DifferentiationError(
                f"'{name}' is complex ({t}); complex values are not differentiated in "
                f"{target.title} kernels",
                kernel=kernel_name, loc=getattr(kernel, "loc", None),
                construct="complex value",
                remedy="split the computation into real and imaginary parts, or "
                       "differentiate the kernel's @njit version on the CPU")


def tape_refusal(t):
    """The error for a complex value the adjoint would have to save on the tape."""
    return DifferentiationError(
        f"a complex value ({t}) would have to be saved on the tape (it is overwritten "
        "before the reverse sweep needs it), which is not supported yet",
        construct="complex value on the tape",
        remedy="keep complex values that the derivative needs in separate variables "
               "(not reassigned in loops), or split them into real and imaginary parts")
