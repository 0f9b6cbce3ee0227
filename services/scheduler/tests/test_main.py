"""The process entry point (``python -m flotilla.scheduler``): garbage collector tuning."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
from flotilla.scheduler import __main__ as entry
before = gc.get_freeze_count()
entry.tune_gc()
print(before, gc.get_freeze_count(), *gc.get_threshold())
"""


def test_start_up_heap_is_frozen_and_young_collections_are_rarer() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    before, frozen, *thresholds = map(int, done.stdout.split())
    assert before == 0
    assert frozen > 10_000  # the imported modules' objects, at least
    assert thresholds == [10_000, 10, 10]
