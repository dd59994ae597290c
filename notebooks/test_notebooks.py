"""Execute every notebook here from top to bottom (CI runs this after the test suite).

Run with `.venv/bin/python -m pytest -q notebooks` (scripts/test.sh does). Notebooks are stored
without outputs, so the repository holds what people write, not what a run printed.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["1_", "2_", "3_", "4_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_a_cpu_in_about_a_minute(path):
    notebook = nbformat.read(path, as_version=4)
    started = time.monotonic()
    NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    seconds = time.monotonic() - started
    assert seconds < 150, f"{path.name} took {seconds:.0f} s; notebooks should run in about a minute"
    errors = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
