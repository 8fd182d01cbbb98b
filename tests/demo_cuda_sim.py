"""The demo's CUDA variant in the simulator (run by tests/test_demo.py in a subprocess
with NUMBA_ENABLE_CUDASIM=1 set before numba is imported).  The kernels live in
kadj/demo/kernels_cuda.py; this script defines none.

Cases: ``gradient`` compares the CUDA model's objective and kadj gradient with the CPU
model's and with float64 central differences; ``demo`` runs ``kadj demo --device cuda``
at a tiny size and checks its exit status, error drop and PNG.  Prints ``CASE <name> OK
<detail>`` or ``CASE <name> FAIL <message>`` per case.
"""
import contextlib
import io
import os
import re
import sys
import tempfile

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402

from cudatools import report_cases  # noqa: E402


def gradient():
    from kadj.demo.models import CpuModel, CudaModel
    from kadj.demo.problem import make_problem
    p = make_problem(8, 5, seed=3)
    x = p.kappa_true.ravel() + 0.3 * np.random.default_rng(4).standard_normal(64)
    f_gpu, g_gpu = CudaModel(p, snapshots=2).loss_and_grad(x)
    cpu = CpuModel(p, snapshots=2)
    f_cpu, g_cpu = cpu.loss_and_grad(x)
    assert abs(f_gpu - f_cpu) <= 1e-12 * abs(f_cpu), (f_gpu, f_cpu)
    err = float(np.max(np.abs(g_gpu - g_cpu)) / np.max(np.abs(g_cpu)))
    assert err < 1e-12, f"CUDA vs CPU gradient: {err:.2e}"
    # both against central differences, component by component (float64)
    eps = 1e-6
    fd = np.empty_like(x)
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = eps
        fd[k] = (cpu.loss(x + e) - cpu.loss(x - e)) / (2.0 * eps)
    fd_err = float(np.max(np.abs(g_gpu - fd)) / np.max(np.abs(fd)))
    assert fd_err < 1e-6, f"CUDA gradient vs finite differences: {fd_err:.2e}"
    return max(err, fd_err)


def demo():
    from kadj.__main__ import main
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "demo.png")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["demo", "--device", "cuda", "--size", "8", "--steps", "5",
                       "--iters", "2", "--output", png, "--no-progress"])
        text = out.getvalue()
        assert rc == 0, text
        assert "device: cuda" in text, text
        m = re.search(r"relative error of kappa\s+([\d.]+) -> ([\d.]+)", text)
        assert m and float(m.group(2)) < float(m.group(1)), text
        assert re.search(r"relative error \S+ \(ok,", text), text
        import matplotlib.image
        img = matplotlib.image.imread(png)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, img.shape
        return float(m.group(2))


if __name__ == "__main__":
    report_cases({"gradient": gradient, "demo": demo}, sys.argv[1:])
