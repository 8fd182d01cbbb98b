"""``python -m kadj demo``: an inverse problem solved end to end with kadj gradients.

It recovers the diffusivity field of a 2-D heat equation from a noisy observation of
the final temperature with L-BFGS (SciPy), the gradient of every objective evaluation
coming from a :class:`kadj.Tape` over a :func:`kadj.checkpointed_loop` time loop.
Modules: :mod:`~kadj.demo.cli` (options; imports nothing heavy), ``kernels_cpu`` /
``kernels_cuda`` (the PDE kernels), ``problem`` (the problem), ``models`` (objective and
gradient per device), ``solve`` (optimisation, checks, summary), ``plot``, ``progress``,
``deps`` (optional dependencies).  Nothing is imported until the demo runs.
"""
