import pytest

from flotilla.common import config
from flotilla.common.errors import ConfigError


def test_reads_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_NATS_URL", "nats://nats:4222")
    monkeypatch.setenv("FLOTILLA_PARTITIONS", "8")
    settings = config.load(config.Settings)
    assert settings.nats_url == "nats://nats:4222"
    assert settings.partitions == 8


def test_secrets_do_not_leak_into_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_REDIS_URL", "redis://:hunter2@redis:6379/0")
    settings = config.load(config.Settings)
    assert "hunter2" not in repr(settings)
    assert settings.redis_url.get_secret_value().endswith("@redis:6379/0")


def test_invalid_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_PARTITIONS", "zero")
    monkeypatch.setenv("FLOTILLA_LOG_LEVEL", "LOUD")
    with pytest.raises(ConfigError) as info:
        config.load(config.Settings)
    assert "FLOTILLA_PARTITIONS" in str(info.value)
    assert "FLOTILLA_LOG_LEVEL" in str(info.value)


def test_each_service_has_its_own_default_health_port() -> None:
    ports = [config.service_defaults(s, {})["health_port"] for s in config.HEALTH_PORTS]
    assert len(set(ports)) == 7 and 8080 not in ports
    assert config.service_defaults("scheduler", {}) == {"health_port": 8083}
    assert config.service_defaults("scheduler", {"FLOTILLA_HEALTH_PORT": "9000"}) == {}
    assert config.service_defaults("unknown", {}) == {}
