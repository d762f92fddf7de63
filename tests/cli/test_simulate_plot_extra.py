"""matplotlib is the ``plot`` extra, not a dependency (the image leaves it out): without it,
``spotgpu simulate --out`` says which extra to install, in one line, with no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# a Python in which "import matplotlib" fails as where the extra is not installed
WITHOUT_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; from spotgpu.cli import main; sys.exit(main())"


def test_out_without_the_plot_extra_names_the_extra(tmp_path: Path) -> None:
    args = ["simulate", "--no-progress", "--nodes", "4", "--days", "0.1", "--out", str(tmp_path / "r")]
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert "pip install 'spotgpu[plot]'" in run.stderr.strip().splitlines()[-1]
    assert run.stdout  # the table was printed first: no figure is lost
