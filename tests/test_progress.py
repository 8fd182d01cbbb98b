"""The one-line message of a slow adjoint generation or compilation (kadj/progress.py)."""
import io
import time

import numpy as np
from numba import njit

import kadj
from kadj import progress


def test_a_slow_block_is_announced_with_its_time(monkeypatch):
    monkeypatch.setenv("KADJ_PROGRESS_AFTER", "0.05")
    out = io.StringIO()
    with progress.notice("compiling the adjoint of f (m.py:3)", stream=out):
        time.sleep(0.4)
    text = out.getvalue()
    assert text.startswith("kadj: compiling the adjoint of f (m.py:3) ... ")
    assert text.endswith(" s\n") and text.count("\n") == 1
    assert 0.3 <= float(text.split("... ")[1].split()[0]) < 30


def test_a_quick_block_says_nothing(monkeypatch):
    monkeypatch.setenv("KADJ_PROGRESS_AFTER", "5")
    out = io.StringIO()
    with progress.notice("compiling", stream=out):
        pass
    time.sleep(0.05)
    assert out.getvalue() == ""


def test_off_says_nothing(monkeypatch):
    monkeypatch.setenv("KADJ_PROGRESS_AFTER", "off")
    out = io.StringIO()
    with progress.notice("compiling", stream=out):
        time.sleep(0.1)
    assert out.getvalue() == ""


def test_a_kernel_names_itself_while_generated_and_compiled(monkeypatch, capsys):
    monkeypatch.setenv("KADJ_PROGRESS_AFTER", "0")
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")

    @kadj.differentiate
    @njit
    def cube_sum(x, out):
        for i in range(x.shape[0]):
            out[0] += x[i] * x[i] * x[i]

    x = np.linspace(0.5, 1.5, 5)
    adj_x = np.zeros(5)
    cube_sum.adjoint(x, np.zeros(1), adj_x, np.ones(1))
    np.testing.assert_allclose(adj_x, 3 * x * x, rtol=1e-12)
    err = capsys.readouterr().err
    line = "cube_sum (test_progress.py:"
    assert f"kadj: generating the adjoint of {line}" in err, err
    assert f"kadj: compiling the adjoint of {line}" in err, err
    cube_sum.adjoint(x, np.zeros(1), adj_x, np.ones(1))   # compiled: nothing more
    assert "kadj:" not in capsys.readouterr().err
