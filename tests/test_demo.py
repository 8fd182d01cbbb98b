"""``python -m kadj demo``: the inverse problem (kadj/demo/) solved end to end.

The CPU run recovers the diffusivity at a small size and must bring the field's error
well below its starting value, pass its own finite-difference check and write a
readable PNG; a wrong gradient must make the check (and the exit status) fail.  The
CUDA variant runs in the simulator in a subprocess (tests/demo_cuda_sim.py), and its
kernels and their adjoints compile to PTX when NVVM is available.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from kadj.__main__ import main
from cudatools import nvvm_available, run_sim_cases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--size", "16", "--steps", "20", "--no-progress"]


def _run(capsys, *args):
    rc = main(["demo", *args])
    return rc, capsys.readouterr().out


def _errors(text):
    m = re.search(r"relative error of kappa\s+([\d.]+) -> ([\d.]+)", text)
    assert m, text
    return float(m.group(1)), float(m.group(2))


def test_help_imports_no_plotting():
    code = ("import sys\nfrom kadj.__main__ import main\n"
            "for argv in (['--help'], ['demo', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n"
            "        assert e.code == 0, e.code\n"
            "print(sorted(m for m in ('matplotlib', 'tqdm') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for option in ("--size", "--steps", "--device", "--output", "--quick"):
        assert option in proc.stdout
    assert "kadj demo" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_cpu_demo_recovers_the_field(tmp_path, capsys):
    png = tmp_path / "demo.png"
    rc, text = _run(capsys, *SMALL, "--iters", "20", "--device", "cpu", "--output", str(png))
    assert rc == 0, text
    start, final = _errors(text)
    assert start == pytest.approx(1.0)
    assert final < 0.5 * start, text
    m = re.search(r"relative error (\S+) \((ok|FAILED), tolerance (\S+)\)", text)
    assert m and m.group(2) == "ok" and float(m.group(1)) <= float(m.group(3)), text
    assert re.search(r"iterations\s+20 ", text), text
    assert "gradient time / forward" in text
    import matplotlib.image
    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 300
    assert float(np.std(img[..., :3])) > 0.05     # a picture, not a blank canvas


def test_wrong_gradient_fails_the_check(tmp_path, capsys, monkeypatch):
    from kadj.demo import models
    right = models.CpuModel.loss_and_grad

    def wrong(self, x):
        f, g = right(self, x)
        return f, 1.001 * g
    monkeypatch.setattr(models.CpuModel, "loss_and_grad", wrong)
    rc, text = _run(capsys, *SMALL, "--iters", "1", "--device", "cpu",
                    "--output", str(tmp_path / "d.png"))
    assert rc == 1
    assert "FAILED" in text


def test_missing_dependency_is_named(monkeypatch, capsys):
    from kadj.demo import deps
    monkeypatch.setattr(deps, "missing", lambda: ["tqdm"])
    assert main(["demo", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "tqdm" in err and "kadj[demo]" in err


@pytest.mark.slow   # about 40 s of the CUDA simulator; the PTX test below runs by default
def test_cuda_demo_in_simulator():
    out = run_sim_cases("demo_cuda_sim.py", ["gradient", "demo"])
    for name, (status, detail) in out.items():
        assert status == "OK", f"{name}: {detail}"


def test_cuda_kernels_compile_to_ptx():
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    import numba
    from numba import cuda
    from kadj.demo import kernels_cuda as k
    from kadj.demo.problem import make_problem
    p = make_problem(8, 2)
    u, w = p.u0, np.zeros_like(p.u0)
    cases = ((k.diffuse, (u, w, p.kappa_true, p.r)),
             (k.objective, (u, p.obs, p.kappa_true, p.weight, p.beta, np.zeros(1))))
    for kernel, args in cases:
        sig = tuple(numba.typeof(a) for a in args)
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".entry" in ptx
        assert ".entry" in kernel.adjoint_ptx(*args, cc=(9, 0))
