"""docker-compose.yml and the Dockerfile, checked without Docker (none on these
machines): the services are all there, built from the one image, health-checked,
started in dependency order, and every command is a console script a package
declares."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("watcher", "depdetector", "scheduler", "transformer", "syncer", "aggregator", "drain")
MEMBERS = ("us-east", "us-west", "eu-central")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def declared_scripts() -> dict[str, str]:
    """Console script → the package that declares it, over the whole workspace."""
    scripts = {}
    for pyproject in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text())["project"]
        for script in project.get("scripts", {}):
            scripts[script] = project["name"]
    return scripts


def built(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"flotilla.{name}.__main__") is not None
    except ModuleNotFoundError:
        return False


def test_every_part_is_there_and_flotilla_containers_share_one_build() -> None:
    services = compose()["services"]
    assert set(services) == {"nats", "redis", "hub", *MEMBERS, "register", *SERVICES, "cli"}
    for name in ("hub", *MEMBERS, "register", *SERVICES, "cli"):
        spec = services[name]
        assert spec["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        assert spec["read_only"] is True, name
    assert "-js" in services["nats"]["command"]
    assert "nats-data:/data" in services["nats"]["volumes"]
    assert "max_payload: 8MB" in compose()["configs"]["nats-conf"]["content"]


def test_long_running_containers_are_health_checked_and_start_in_order() -> None:
    services = compose()["services"]
    for name, spec in services.items():
        if name in ("register", "cli"):
            continue
        assert spec["healthcheck"]["test"], name
    for name in SERVICES:
        spec = services[name]
        assert "/readyz" in " ".join(spec["healthcheck"]["test"])
        assert spec["depends_on"] == {
            "nats": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
            "register": {"condition": "service_completed_successfully"},
        }
    register = services["register"]["depends_on"]
    assert {"hub", *MEMBERS} <= set(register)


def test_each_service_has_its_own_health_port() -> None:
    services = compose()["services"]
    ports = [services[name]["environment"]["FLOTILLA_HEALTH_PORT"] for name in SERVICES]
    assert ports == [str(8081 + i) for i in range(7)]


@pytest.mark.parametrize("name", [*SERVICES, "hub", "register", "cli"])
def test_commands_are_console_scripts_the_packages_declare(name: str) -> None:
    spec = compose()["services"][name]
    command = (spec.get("entrypoint") or spec["command"])[0]
    assert command in declared_scripts(), f"{name}: {command} is not a declared console script"


def test_the_env_example_names_every_variable_compose_reads() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z_]+)(?::-[^}]*)?\}", text))
    example = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert used == example


def test_the_image_is_multi_stage_slim_and_not_root() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) >= 2 and all("-slim" in line for line in stages)
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1].split()[1].split(":")[0] not in ("root", "0")
    assert any("uv sync --frozen" in line for line in lines), "built from the lock file"


def test_simulated_clusters_keep_their_ca_across_restarts() -> None:
    services = compose()["services"]
    for name in ("hub", *MEMBERS):
        command = services[name]["command"]
        assert command[command.index("--tls-dir") + 1] == f"/kube/tls-{name}"
        assert command[command.index("--kubeconfig") + 1] == f"/kube/{name}.yaml"
