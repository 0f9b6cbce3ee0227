"""JetStream publishes answered through one reply subscription (`flotilla.common.acks`),
against a real nats-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import api

from flotilla.common.acks import Acks
from flotilla.common.infra import NatsServer
from flotilla.common.store import EXPECTED_LAST_SUBJECT_SEQUENCE, WRONG_LAST_SEQUENCE

pytestmark = pytest.mark.integration


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NatsClient]:
    client = await nats.connect(nats_server.url)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def stream(nc: NatsClient) -> str:
    """A fresh stream taking ``<name>.>``; its name."""
    name = f"acks{uuid.uuid4().hex[:8]}"
    await nc.jetstream().add_stream(api.StreamConfig(name=name.upper(), subjects=[f"{name}.>"]))
    return name


async def test_each_publish_gets_its_own_acknowledgement(nc: NatsClient, stream: str) -> None:
    acks = Acks(nc)
    answers = await asyncio.gather(
        *(acks.publish(f"{stream}.k{i % 7}", str(i).encode()) for i in range(200))
    )
    assert sorted(a.seq for a in answers) == list(range(1, 201))
    # The answer carries this publish's own sequence: reading it back gives its payload.
    js = nc.jetstream()
    for i in (0, 57, 199):
        stored = await js.get_msg(stream.upper(), answers[i].seq)
        assert stored.data == str(i).encode()
    assert acks.waiting == 0


async def test_a_duplicate_is_acknowledged_as_one(nc: NatsClient, stream: str) -> None:
    acks = Acks(nc)
    first = await acks.publish(f"{stream}.a", b"x", {"Nats-Msg-Id": "same"})
    again = await acks.publish(f"{stream}.a", b"x", {"Nats-Msg-Id": "same"})
    assert again.duplicate and again.seq == first.seq


async def test_a_refused_compare_and_set_raises_at_once(nc: NatsClient, stream: str) -> None:
    """nats-py's own publish_async never resolves a refused publish; this must."""
    acks = Acks(nc, timeout=30)
    subject = f"{stream}.record"
    first = await acks.publish(subject, b"1", {EXPECTED_LAST_SUBJECT_SEQUENCE: "0"})
    with pytest.raises(nats.js.errors.APIError) as refused:
        await asyncio.wait_for(
            acks.publish(subject, b"2", {EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}), timeout=5
        )
    assert refused.value.err_code in WRONG_LAST_SEQUENCE
    written = await acks.publish(subject, b"2", {EXPECTED_LAST_SUBJECT_SEQUENCE: str(first.seq)})
    assert written.seq == first.seq + 1
    assert acks.waiting == 0


async def test_a_subject_no_stream_takes_says_so(nc: NatsClient) -> None:
    acks = Acks(nc, timeout=30)
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await asyncio.wait_for(acks.publish(f"nowhere{uuid.uuid4().hex}", b"x"), timeout=5)
    assert acks.waiting == 0


async def test_no_answer_times_out_and_is_forgotten(nc: NatsClient) -> None:
    """A listener that never answers stands for an acknowledgement lost on the way."""
    subject = f"silent{uuid.uuid4().hex}"
    heard: list[bytes] = []

    async def listen(msg: nats.aio.msg.Msg) -> None:
        heard.append(msg.data)

    await nc.subscribe(subject, cb=listen)
    acks = Acks(nc, timeout=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(nats.errors.TimeoutError):
        await acks.publish(subject, b"x")
    assert 0.25 <= loop.time() - started < 3
    assert heard == [b"x"]
    assert acks.waiting == 0


async def test_a_cancelled_publisher_leaves_nothing_behind(nc: NatsClient, stream: str) -> None:
    acks = Acks(nc)
    sending = asyncio.ensure_future(acks.publish(f"{stream}.c", b"x"))
    await asyncio.sleep(0)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    # Its answer still arrives (the message was sent) and finds nobody waiting.
    later = await acks.publish(f"{stream}.c", b"y")
    assert later.seq >= 1
    assert acks.waiting == 0


@pytest.mark.parametrize("answer", [b"not json", b"{}", b'{"stream": "S"}'])
async def test_an_unreadable_answer_fails_the_publish(nc: NatsClient, answer: bytes) -> None:
    subject = f"odd{uuid.uuid4().hex}"

    async def respond(msg: nats.aio.msg.Msg) -> None:
        await nc.publish(msg.reply, answer)

    await nc.subscribe(subject, cb=respond)
    acks = Acks(nc, timeout=30)
    with pytest.raises(nats.errors.Error, match="unreadable acknowledgement"):
        await asyncio.wait_for(acks.publish(subject, b"x"), timeout=5)
    assert acks.waiting == 0
