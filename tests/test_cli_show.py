"""``python -m kadj show``: a kernel named by a module or a file (a package's module
too), a CUDA kernel's adjoint in every form, and each error as one sentence (exit 2)."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import kadj
from kadj.__main__ import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAT_ARGS = "np.ones(8), np.zeros(8), 0.1"

CPU_MODULE = '''
from numba import njit
import numpy as np


@njit
def scale(x, y, a):
    for i in range(x.shape[0]):
        y[i] = a * x[i]


@njit
def with_objmode(x, y):
    for i in range(x.shape[0]):
        with __import__("numba").objmode():
            pass
        y[i] = x[i]


NOT_A_KERNEL = 3
'''

CUDA_MODULE = '''
import numpy as np
from numba import cuda
import kadj


@kadj.differentiate
@cuda.jit
def heat(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def ring(u, u_new, alpha):
    i = cuda.grid(1)
    n = u.shape[0]
    if i < n:
        u_new[i] = u[i] + alpha * (u[(i - 1 + n) % n] - 2.0 * u[i] + u[(i + 1) % n])
'''


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    d = tmp_path_factory.mktemp("show_modules")
    (d / "show_cpu_mod.py").write_text(CPU_MODULE)
    (d / "show_cuda_mod.py").write_text(CUDA_MODULE)
    return d


def _run(capsys, *argv):
    status = main(["show", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_a_file_inside_a_package_is_imported_as_its_module(capsys, monkeypatch):
    # kernels/cpu/stencils.py imports relatively: it must be imported as
    # kernels.cpu.stencils, not as a loose file
    monkeypatch.chdir(ROOT)
    status, out, err = _run(capsys, "kernels/cpu/stencils.py:heat_step",
                            "--args", HEAT_ARGS)
    assert status == 0, err
    from kernels.cpu.stencils import heat_step
    expected = kadj.differentiate(heat_step).adjoint_source(
        np.ones(8), np.zeros(8), 0.1)
    assert out == expected + "\n"
    assert sys.modules["kernels.cpu.stencils"].__file__ == str(
        ROOT / "kernels" / "cpu" / "stencils.py")


def test_a_loose_file_and_a_module_name(capsys, modules, monkeypatch):
    status, by_path, err = _run(capsys, f"{modules / 'show_cpu_mod.py'}:scale",
                                "--args", HEAT_ARGS)
    assert status == 0, err and "def scale_adjoint(" in by_path
    monkeypatch.chdir(modules)
    status, by_name, err = _run(capsys, "show_cpu_mod:scale", "--args", HEAT_ARGS)
    assert status == 0, err
    assert by_name == by_path


def test_a_cuda_kernel_is_printed_in_every_form(capsys, modules):
    pytest.importorskip("numba.cuda")
    target = f"{modules / 'show_cuda_mod.py'}"
    status, out, err = _run(capsys, f"{target}:heat", "--args", HEAT_ARGS)
    assert status == 0, err
    labels = [ln for ln in out.splitlines() if ln.startswith("# ---- ")]
    assert labels == ["# ---- scatter ----", "# ---- gather ----", "# ---- zero ----"]
    for suffix in ("", "_gather", "_zero"):
        assert f"def heat_adjoint{suffix}(" in out
    assert "cuda.atomic.add" in out.split("# ---- gather ----")[0]
    # one form alone
    status, gather, _ = _run(capsys, f"{target}:heat", "--args", HEAT_ARGS,
                             "--form", "gather")
    assert status == 0 and gather.count("def heat_adjoint") == 1
    assert "def heat_adjoint_gather(" in gather
    assert not [ln for ln in gather.splitlines() if ln.startswith("# ---- ")]
    # a kernel without a gather form says why
    status, ring, _ = _run(capsys, f"{target}:ring", "--args", HEAT_ARGS)
    assert status == 0
    assert [ln for ln in ring.splitlines() if ln.startswith("# ")][0:1] == \
        ["# ---- scatter ----"]
    assert "# no gather form: " in ring and "def ring_adjoint_gather" not in ring
    status, _, err = _run(capsys, f"{target}:ring", "--args", HEAT_ARGS,
                          "--form", "gather")
    assert status == 2 and err.startswith("kadj show: 'ring' has no gather form: ")


ERRORS = [
    (["no_such_dir/none.py:k"], "there is no file 'no_such_dir/none.py'"),
    (["no_such_module_kadj:k"], "there is no module 'no_such_module_kadj'"),
    (["{m}/show_cpu_mod.py:nope", "--args", "1"],
     "module 'show_cpu_mod' has no kernel 'nope' (its kernels: scale, with_objmode)"),
    (["{m}/show_cpu_mod.py:NOT_A_KERNEL", "--args", "1"],
     "'NOT_A_KERNEL' in 'show_cpu_mod' is not a kernel"),
    (["{m}/show_cpu_mod.py:scale", "--args", "np.ones(8), np.zeros("],
     "--args 'np.ones(8), np.zeros(' does not evaluate (SyntaxError"),
    (["{m}/show_cpu_mod.py:scale", "--args", "np.ones(8), np.zeros(8)"],
     "the arguments given by --args do not fit kernel 'scale'"),
    (["{m}/show_cpu_mod.py:scale"], "--args is needed: example arguments for scale(x, y, a)"),
    (["{m}/show_cpu_mod.py:with_objmode", "--args", "np.ones(4), np.zeros(4)"],
     "kadj cannot differentiate 'with_objmode': "),
    (["scale"], "expected MODULE:KERNEL"),
]


@pytest.mark.parametrize("argv, sentence", ERRORS, ids=[
    "no-file", "no-module", "no-kernel", "not-a-kernel", "bad-args", "args-misfit",
    "no-args", "refused", "no-colon"])
def test_each_error_is_one_sentence_with_status_2(capsys, modules, argv, sentence):
    argv = [a.replace("{m}", str(modules)) for a in argv]
    status, out, err = _run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.startswith("kadj show: " + sentence), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_command_exits_2_without_a_traceback(modules):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "kadj", "show",
                           f"{modules / 'show_cpu_mod.py'}:nope"], cwd=modules, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("kadj show: module 'show_cpu_mod' has no kernel 'nope'")
    assert "Traceback" not in proc.stderr
