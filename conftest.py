"""Root conftest: the shared fixtures every test directory may use."""

import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["flotilla.common.testing"]

# Machines here are small and shared: no per-example deadline, no example database
# left behind; CI replays the same examples every run so a failure reproduces.
settings.register_profile(
    "flotilla",
    deadline=None,
    database=None,
    derandomize=os.environ.get("CI") == "true",
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("flotilla")
