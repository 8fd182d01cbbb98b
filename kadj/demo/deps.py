"""The demo's optional dependencies (the ``demo`` extra of kadj's pyproject.toml)."""
import importlib.util

REQUIRED = ("scipy", "matplotlib", "tqdm")


def missing():
    """The names of the demo's dependencies that are not installed."""
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def message(names):
    """One sentence saying what to install."""
    return (f"kadj demo needs {', '.join(names)}: install them with "
            f"pip install \"kadj[demo]\" (or pip install {' '.join(names)}).")
