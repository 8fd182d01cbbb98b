"""CUDA support: typing of ``@cuda.jit`` kernels and the adjoint writer for GPU threads."""
