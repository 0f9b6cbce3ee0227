"""Root conftest: the shared fixtures every test directory may use."""

pytest_plugins = ["flotilla.common.testing"]
