"""kadj: kernel-level adjoints (reverse-mode derivatives) for Numba kernels.

Put ``@kadj.differentiate`` above ``@numba.njit``; kadj reads the kernel's typed Numba
IR and generates its adjoint as a new kernel.  See README.md and API.md.
"""
from .errors import DifferentiationError, InternalError
from .api import (DifferentiatedKernel, differentiate, grad, value_and_grad,
                  register_adjoint)
from . import ops

from .tape import Tape, TapeError
from .checkpointing import checkpointed_loop
from .jvp_api import jvp
from .hessian import hvp
from .tape import custom_step
from .cachedir import CacheWarning
from . import testing  # noqa: E402

__all__ = ["DifferentiationError", "InternalError", "DifferentiatedKernel", "differentiate",
           "grad", "value_and_grad", "jvp", "hvp", "register_adjoint", "Tape", "TapeError",
           "checkpointed_loop", "custom_step", "CacheWarning",
           "ops", "testing"]
__version__ = "0.1.0"
