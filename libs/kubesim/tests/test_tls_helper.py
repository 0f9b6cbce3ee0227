"""The certificates come from a helper process, so a server never imports cryptography."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flotilla.kubesim import tls

_SERVE_ONCE = textwrap.dedent(
    """
    import asyncio, sys
    import aiohttp
    from flotilla.kubesim.server import KubeSim
    from flotilla.kubesim.sim import SimOptions

    async def main():
        async with KubeSim("solo", sim=SimOptions(nodes=2)) as kubesim:
            connector = aiohttp.TCPConnector(ssl=kubesim.client_ssl())
            headers = {"Authorization": f"Bearer {kubesim.token}"}
            async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
                async with http.get(f"{kubesim.url}/api/v1/nodes") as response:
                    assert response.status == 200, response.status
        print(kubesim.url.split(":")[0], *(m in sys.modules for m in ("cryptography", "croniter")))

    asyncio.run(main())
    """
)


def test_a_cluster_process_imports_neither_cryptography_nor_croniter() -> None:
    # cryptography stays in the certificate helper; croniter waits for a CronJob.
    done = subprocess.run(
        [sys.executable, "-c", _SERVE_ONCE], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["https", "False", "False"]


async def test_a_malformed_request_is_refused_with_its_reason() -> None:
    with pytest.raises(tls.CertificateError, match="`hosts` must be a non-empty list"):
        await tls.provision("x", [])
    with pytest.raises(tls.CertificateError, match="PEM"):
        await tls.provision("x", ["127.0.0.1"], tls.Authority(b"not a cert", b"not a key"))


async def test_the_helper_exits_when_idle_and_the_next_request_starts_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tls._helper.close()
    monkeypatch.setattr(tls, "IDLE_SECONDS", 0.2)
    first, _ = await tls.provision("one", ["127.0.0.1"])
    process = tls._helper._process
    assert process is not None
    await asyncio.to_thread(process.wait, 10)
    assert process.returncode == 0
    second, _ = await tls.provision("two", ["127.0.0.1"])
    assert tls._helper._process not in (None, process)
    assert first.cert_pem != second.cert_pem
    tls._helper.close()


def test_a_helper_gone_before_answering_is_replaced_and_the_request_answered() -> None:
    tls._helper.close()
    # Reads the request, then exits without an answer (an idle exit racing a request).
    quitter = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    tls._helper._process = quitter
    answer = tls._helper.ask({"name": "x", "hosts": ["127.0.0.1", "localhost"], "ca": None})
    assert quitter.returncode == 0
    assert tls._helper._process not in (None, quitter)
    serving = tls.Serving(answer["cert"].encode(), answer["key"].encode())
    assert serving.chain_pem.endswith(answer["ca"]["cert"].encode())
    tls.server_context(serving)  # the key matches the certificate
    tls._helper.close()


async def test_a_ca_kept_in_a_directory_issues_the_next_serving_certificate(
    tmp_path: Path,
) -> None:
    first, one = await tls.provision("kept", ["127.0.0.1"], directory=tmp_path)
    second, two = await tls.provision("kept", ["127.0.0.1"], directory=tmp_path)
    assert first == second
    assert one.key_pem != two.key_pem
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca.crt").stat().st_mode & 0o777 == 0o600
