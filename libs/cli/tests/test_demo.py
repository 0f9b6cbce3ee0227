"""`make demo` end to end: the drain scenario on its own environment holds (the app
moved, the cluster drained, availability never zero) and everything is stopped
afterwards. It needs all seven services; until they are installed the command
refuses with one line naming the missing ones (tested in test_units)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flotilla.cli import demo, environment

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        bool(demo.missing_services()),
        reason=f"the demo needs every service; missing: {demo.missing_services()}",
    ),
]


def test_the_demo_scenario_holds_and_cleans_up(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flotilla.cli", "--state-dir", str(tmp_path), "demo"],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    out = done.stdout
    assert "objects moved:         1" in out
    minimum = out.split("minimum availability:", 1)[1].split()[0]
    assert minimum != "-" and int(minimum.rstrip("%")) > 0
    assert len(out.split("trace id of the drain:", 1)[1].split()[0]) == 32
    assert "environment stopped" in out
    assert not environment.env_path(tmp_path).exists()
