"""docs/gallery.md lists every gallery kernel (written by scripts/gallery_doc.py).

A kernel added to kernels/cpu or kernels/cuda without running the script again fails
here; nothing is timed or compiled.
"""
import importlib.util
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kernels.cpu import GALLERY  # noqa: E402
from kernels.cuda import all_cases  # noqa: E402

PAGE = os.path.join(ROOT, "docs", "gallery.md")


def _rows(section):
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in body.splitlines()
            for m in [re.match(r"\| `(\w+)` \|", line)] if m}


def _cells(line):
    """A table row's cells (``\\|`` inside a cell is an escaped bar)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _script():
    spec = importlib.util.spec_from_file_location(
        "gallery_doc", os.path.join(ROOT, "scripts", "gallery_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_cpu_kernel_is_listed_with_a_ratio():
    rows = _rows("CPU")
    missing = [ex.name for ex in GALLERY if ex.name not in rows]
    assert not missing, f"run scripts/gallery_doc.py: {missing} not in docs/gallery.md"
    assert set(rows) == {ex.name for ex in GALLERY}, "docs/gallery.md lists removed kernels"
    for name, line in rows.items():
        cells = _cells(line)
        assert cells[1], f"{name}: no description (give the kernel a docstring)"
        # a ratio, or the reason it was not measured
        assert cells[3].startswith("not timed: ") or float(cells[3]) > 0, line


def test_every_cuda_kernel_is_listed():
    rows = _rows("CUDA")
    names = {case.name for case in all_cases()}
    missing = sorted(names - set(rows))
    assert not missing, f"run scripts/gallery_doc.py: {missing} not in docs/gallery.md"
    assert set(rows) == names, "docs/gallery.md lists removed kernels"
    for name, line in rows.items():
        cells = _cells(line)
        assert cells[1] and cells[2].startswith("scatter"), line
        assert cells[4].isdigit(), f"{name}: PTX atomics not counted: {line}"


def test_accumulation_classes_read_from_the_adjoint_ir():
    ir_text = "\n".join([
        "    ReverseLoop(strategy='ascending', loop=1)",
        "            Consume(target=AdjElem(adj_y[i]), zero='0.0')",
        "            Accumulate(target=AdjElem(adj_x[i + 1]), op='+=', value='g', how='plain')",
        "            Accumulate(target=AdjVar(adj_a), op='+=', value='g', how='plain')",
        "            Accumulate(target=AdjElem(adj_y[i]), op='+=', value='g', how='plain')",
        "    ReverseLoop(strategy='taped', loop=2)",
        "    ReverseLoop(strategy='taped', loop=3)",
    ])
    classes, loops = _script().accumulation_classes(ir_text)
    assert classes == {"adj_x": "+=", "adj_y": "+=, consumed"}
    assert dict(loops) == {"ascending": 1, "taped": 2}
