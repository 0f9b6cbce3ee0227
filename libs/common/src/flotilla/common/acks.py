"""JetStream publishes answered through one reply subscription, each with a deadline.

A JetStream publish is acknowledged by a reply: the stream's sequence, or an error
(a compare-and-set that lost, a message too large). nats-py offers two ways:

- ``JetStreamContext.publish`` is a request: per call a reply token drawn from
  ``os.urandom``, a future and an ``asyncio.wait_for`` of it. A service that writes a
  record and publishes an event per decision pays that twice per decision (about
  a tenth of the bare I/O cost of a decision, `bench/io_floor.py`).
- ``JetStreamContext.publish_async`` answers every publish through one shared
  reply subscription, but its future has no deadline: an acknowledgement lost on
  the way (the server restarted between storing the message and answering) leaves
  the writer waiting forever. Worse, a refusal never reaches it either: its reply
  callback hands the server's error to ``APIError.from_error``, which raises
  instead of returning, so the future is never resolved (nats-py 2.16).

`Acks` is the second with a deadline: one wildcard reply subscription per
connection, a counter for tokens, and one timer per publish that fails its future
with ``nats.errors.TimeoutError`` if no answer came (the same error a request
raises, so callers map both alike). Written by hand because neither nats-py call
gives both; it keeps nats-py's connection, reconnection (the subscription is
renewed with the connection) and error types.

Ordering is the caller's: a writer that must not publish before its record is
stored awaits the record's acknowledgement first, as before.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import api

ACK_TIMEOUT = 5.0
"""Seconds a publish waits for its acknowledgement (nats-py's JetStream default)."""

NO_RESPONDERS = "503"


class Acks:
    """Publishes to JetStream on `nc` and their acknowledgements (module docstring)."""

    def __init__(self, nc: NatsClient, timeout: float = ACK_TIMEOUT) -> None:
        self.nc = nc
        self.timeout = timeout
        self._prefix: str | None = None
        self._starting = asyncio.Lock()
        self._tokens = itertools.count(1)
        self._waiting: dict[str, tuple[asyncio.Future[api.PubAck], asyncio.TimerHandle]] = {}

    @property
    def waiting(self) -> int:
        """Publishes sent and not yet answered nor timed out."""
        return len(self._waiting)

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> api.PubAck:
        """Publish and wait for the acknowledgement; nats-py's errors: ``APIError``
        (with the server's error code) when refused, ``NoStreamResponseError`` when
        no stream takes the subject, ``TimeoutError`` when no answer came in time."""
        prefix = self._prefix or await self._start()
        token = str(next(self._tokens))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[api.PubAck] = loop.create_future()
        timer = loop.call_later(self.timeout, self._expire, token)
        self._waiting[token] = (future, timer)
        try:
            await self.nc.publish(subject, data, reply=prefix + token, headers=headers)
        except BaseException:
            self._forget(token)
            raise
        return await future

    async def _start(self) -> str:
        async with self._starting:
            if self._prefix is None:
                prefix = self.nc.new_inbox() + "."
                await self.nc.subscribe(prefix + "*", cb=self._answer)
                self._prefix = prefix
        return self._prefix

    def _forget(self, token: str) -> asyncio.Future[api.PubAck] | None:
        waiting = self._waiting.pop(token, None)
        if waiting is None:
            return None
        future, timer = waiting
        timer.cancel()
        return None if future.done() else future

    def _expire(self, token: str) -> None:
        future = self._forget(token)
        if future is not None:
            future.set_exception(nats.errors.TimeoutError())

    async def _answer(self, msg: Msg) -> None:
        future = self._forget(msg.subject.rsplit(".", 1)[-1])
        if future is None:
            return  # timed out, or its publisher was cancelled
        if msg.headers and msg.headers.get(api.Header.STATUS) == NO_RESPONDERS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer: Any = json.loads(msg.data)
            if "error" in answer:
                nats.js.errors.APIError.from_error(answer["error"])  # raises the right kind
            # The fields a JetStream publish is answered with, without nats-py's
            # generic `from_response` (it looks the dataclass's fields up per call).
            future.set_result(
                api.PubAck(
                    stream=answer["stream"],
                    seq=answer["seq"],
                    domain=answer.get("domain"),
                    duplicate=answer.get("duplicate"),
                )
            )
        except nats.js.errors.APIError as refused:
            future.set_exception(refused)
        except (ValueError, TypeError, KeyError) as exc:
            future.set_exception(nats.errors.Error(f"unreadable acknowledgement: {exc}"))
