"""``python -m kadj report``: the cost card as a table and as JSON, the comparison with
a saved card (--baseline), and a CUDA kernel's atomics counted in its PTX."""
import json
import re

import numpy as np
import pytest

from kadj import cost_card
from kadj.__main__ import main

N = 40
SAVED = 2 * (N - 2)    # values the adjoint of the recurrence below records
ARGS = f"np.linspace(0.1, 0.9, {N}), np.linspace(0.2, 0.7, {N}), 0.5"

MODULE = '''
from numba import njit


@njit
def recurrence(y, x, a):
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] * y[i] + x[i]
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] * y[i] + x[i]
'''

CUDA_MODULE = '''
from numba import cuda
import kadj


@kadj.differentiate
@cuda.jit
def heat(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
'''


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    d = tmp_path_factory.mktemp("report_modules")
    (d / "report_cpu_mod.py").write_text(MODULE)
    (d / "report_cuda_mod.py").write_text(CUDA_MODULE)
    return d


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
    """The JSON card of the recurrence (timed with 3 calls)."""
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        status = main(["report", f"{target / 'report_cpu_mod.py'}:recurrence",
                       "--args", ARGS, "--json", "--repeat", "3"])
    assert status == 0
    path = tmp_path_factory.mktemp("cards") / "card.json"
    path.write_text(buf.getvalue())
    return path


def test_json_card_of_a_cpu_kernel(saved):
    card = json.loads(saved.read_text())
    assert card["kernel"] == "recurrence" and card["target"] == "cpu"
    # each loop runs N - 1 iterations and saves, from the second on, a value it loads
    # that a later store overwrites (the last one stays in its variable): the first
    # loop's y[i - 1] (the second loop rewrites it; its y[i] is read from the user's
    # array), the second loop's y[i]; the second loop's y[i - 1] is recomputed
    assert card["recorded_values"] == SAVED and card["tape_bytes"] == 8 * SAVED
    assert card["tape_by_kind"] == {"f64": SAVED} and card["tape_per"] == "call"
    assert card["accumulation"] == {"y": "plain", "x": "plain", "a": "plain"}
    assert card["atomics"] == "n/a (CPU kernel)"
    assert card["forward_s"] > 0 and card["adjoint_s"] > 0
    assert card["adjoint_over_forward"] == pytest.approx(
        card["adjoint_s"] / card["forward_s"])
    assert 10 < card["adjoint_lines"] < 60


def test_table(target, capsys):
    status = main(["report", f"{target / 'report_cpu_mod.py'}:recurrence",
                   "--args", ARGS, "--repeat", "2"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("kadj cost card: recurrence (CPU)\n")
    rows = dict(re.split(r"\s{2,}", ln.strip(), maxsplit=1)
                for ln in out.splitlines()[1:])
    assert rows["recorded values / call"] == str(SAVED)
    assert rows["tape bytes / call"] == f"{8 * SAVED} B"
    assert rows["accumulation x"] == "plain"
    assert re.fullmatch(r"\d+\.\d\dx", rows["adjoint / forward"])


def test_baseline_passes_then_fails_naming_each_regression(target, saved, tmp_path,
                                                           capsys):
    kernel = f"{target / 'report_cpu_mod.py'}:recurrence"
    # against its own card, with a threshold wide enough for timing noise: no regression
    status = main(["report", kernel, "--args", ARGS, "--repeat", "2",
                   "--baseline", str(saved), "--threshold", "1000"])
    assert status == 0, capsys.readouterr().err
    assert "no regression" in capsys.readouterr().err
    # a baseline that was cheaper in every respect
    base = json.loads(saved.read_text())
    base.update(adjoint_over_forward=1e-9, tape_bytes=8)
    base["accumulation"]["x"] = "none"
    cheaper = tmp_path / "cheaper.json"
    cheaper.write_text(json.dumps(base))
    status = main(["report", kernel, "--args", ARGS, "--repeat", "2",
                   "--baseline", str(cheaper)])
    err = capsys.readouterr().err
    assert status == 1
    assert "3 regression(s)" in err
    assert "adjoint/forward" in err and "threshold 1.25x" in err
    assert f"tape_bytes grew from 8 to {8 * SAVED}" in err
    assert "accumulation into 'x' got dearer: none -> plain" in err


def test_baseline_errors_are_one_sentence(target, tmp_path, capsys):
    kernel = f"{target / 'report_cpu_mod.py'}:recurrence"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["report", kernel, "--args", ARGS, "--baseline", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"kadj report: the baseline '{bad}' is "
                                              "not JSON")
    assert main(["report", kernel, "--args", ARGS, "--baseline",
                 str(tmp_path / "missing.json")]) == 2
    assert "cannot read the baseline" in capsys.readouterr().err


def test_regressions_compares_atomics_and_accumulation_ranks():
    base = {"atomics": 2, "atomics_gather": "n/a (no gather form)",
            "adjoint_over_forward": 2.0, "tape_bytes": 16,
            "accumulation": {"u": "plain", "alpha": "atomic"}}
    same = dict(base, adjoint_over_forward=2.4)            # within 1.25x
    assert cost_card.regressions(same, base) == []
    worse = dict(base, atomics=3, adjoint_over_forward=2.6,
                 accumulation={"u": "atomic", "alpha": "block-reduced"})
    found = cost_card.regressions(worse, base)
    assert found == ["adjoint/forward 2.60x exceeds the baseline's 2.00x by more than "
                     "the threshold 1.25x (limit 2.50x)",
                     "atomics grew from 2 to 3",
                     "accumulation into 'u' got dearer: plain -> atomic"]


def test_cuda_card_counts_the_atomics_in_the_ptx(target, capsys):
    pytest.importorskip("numba.cuda")
    from cudatools import nvvm_available
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    status = main(["report", f"{target / 'report_cuda_mod.py'}:heat", "--args",
                   "np.ones(16), np.zeros(16), 0.1", "--json"])
    assert status == 0
    card = json.loads(capsys.readouterr().out)
    from report_cuda_mod import heat
    args = (np.ones(16), np.zeros(16), 0.1)
    for field, form in (("atomics", "scatter"), ("atomics_gather", "gather")):
        ptx = heat.adjoint_ptx(*args, form=form)
        counted = sum(1 for ln in ptx.splitlines()
                      if ln.split() and ln.split()[0].startswith(("atom.", "red.")))
        assert card[field] == counted
    assert card["atomics"] > card["atomics_gather"] > 0   # gathering saves atomics
    assert card["accumulation"]["u"] == "atomic" and card["access"]["u"] == "neighbour"
    assert card["tape_per"] == "thread" and card["tape_bytes"] == 0
    if not cost_card.gpu_present():
        assert card["registers"] == "n/a (no GPU)"
        assert card["adjoint_over_forward"] == "n/a (no GPU)"
