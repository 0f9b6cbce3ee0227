"""Which replica of a service consumes which partition, via leases in a JetStream KV.

Per-key order with several replicas needs every key's events to reach one replica
at a time. Events are partitioned by key (`flotilla.common.topology`); this module
hands each partition to exactly one live replica:

- every replica heartbeats a membership key ``<group>.members.<instance>``;
- each computes the same desired owner per partition by rendezvous hashing with
  bounded load over the live members (balanced; a change moves few partitions);
- ownership itself is a lease key ``<group>.p<n>`` taken with KV *create*
  (atomic: at most one holder) and renewed by compare-and-set *update*; the
  bucket's TTL expires the leases of a replica that died.

Correctness comes from the compare-and-set, not from timing: two replicas may
briefly disagree about the member list, but never both hold one lease. A replica
gives a partition up only after draining its in-flight work (the caller's
`on_release`), so the next owner starts from where it stopped.

Renewal never waits for a drain: a partition being given up drains in a task of
its own while `tick` keeps renewing every lease still held, its own included, so a
slow key (a drain may take up to the consumer's ack wait, longer than the lease
TTL) can never let this replica's other leases lapse.

Renewal is also the first thing a round does, all of a replica's leases at once
(one round trip, not one per partition), before the membership heartbeat and
listing: on a replica whose event loop is busy with handlers every round trip
waits its turn, and sixteen of them one after another used to let leases lapse
under load (a lapse moves the partition, and messages the old owner still held
come back late, after newer ones of the same key). The listing reads this group's
membership keys only, not every service's leases and members.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

log = logging.getLogger(__name__)


def _weight(partition: int, member: str) -> bytes:
    return hashlib.blake2b(f"{partition}/{member}".encode(), digest_size=8).digest()


def assignment(partitions: int, members: Iterable[str]) -> dict[int, str]:
    """Partition → member: rendezvous hashing with bounded load.

    Each partition goes to the member with the highest hash weight among those
    still below ceil(P/N) partitions, so shares are balanced even for few
    partitions, and a membership change moves few of them.
    """
    ordered = sorted(set(members))
    if not ordered:
        return {}
    cap = -(-partitions // len(ordered))
    load = dict.fromkeys(ordered, 0)
    result: dict[int, str] = {}
    for partition in range(partitions):
        ranked = sorted(ordered, key=lambda m: (_weight(partition, m), m), reverse=True)
        chosen = next(m for m in ranked if load[m] < cap)
        load[chosen] += 1
        result[partition] = chosen
    return result


class PartitionLeases:
    def __init__(
        self,
        kv: Any,
        *,
        group: str,
        instance: str,
        partitions: int,
        on_acquire: Callable[[int], Awaitable[None]],
        on_release: Callable[[int], Awaitable[None]],
    ) -> None:
        self._kv = kv
        self._group = group
        self._instance = instance
        self._partitions = partitions
        self._on_acquire = on_acquire
        self._on_release = on_release
        self.owned: dict[int, int] = {}  # partition -> lease revision
        self.releasing: dict[int, asyncio.Task[None]] = {}
        self.lost = 0
        """Leases this replica found taken or expired when renewing (should stay 0)."""
        self._lock = asyncio.Lock()  # one lease write at a time: renewals and deletes

    def _lease_key(self, partition: int) -> str:
        return f"{self._group}.p{partition}"

    async def members(self) -> list[str]:
        """The live members of this group (their membership keys; other groups'
        keys and the leases are not read)."""
        prefix = f"{self._group}.members."
        watcher = await self._kv.watch(f"{prefix}>", ignore_deletes=True, meta_only=True)
        names = []
        try:
            async for entry in watcher:
                if entry is None:  # nothing more held now
                    break
                names.append(entry.key[len(prefix) :])
        finally:
            await watcher.stop()
        return sorted(names)

    async def renew(self) -> None:
        """Renew every lease held, all at once; a lease found taken or expired is
        given up (its partition stops)."""
        async with self._lock:
            held = list(self.owned.items())

            async def renew_one(partition: int, revision: int) -> None:
                try:
                    self.owned[partition] = await self._kv.update(
                        self._lease_key(partition), self._instance.encode(), last=revision
                    )
                except (KeyWrongLastSequenceError, KeyNotFoundError):
                    log.warning("lease on partition %d was lost; stopping it", partition)
                    self.lost += 1
                    self.owned.pop(partition, None)
                    self._release_later(partition)

            outcomes = await asyncio.gather(
                *(renew_one(p, r) for p, r in held), return_exceptions=True
            )
        for outcome in outcomes:  # every renewal has ended; a failed round is retried
            if isinstance(outcome, BaseException):
                raise outcome

    async def tick(self) -> set[int]:
        """One round: renew, heartbeat, start giving up what is no longer ours,
        acquire the rest. Never waits for a partition to drain."""
        await self.renew()
        await self._kv.put(f"{self._group}.members.{self._instance}", b"1")
        members = await self.members()
        if self._instance not in members:
            members.append(self._instance)
        owners = assignment(self._partitions, members)
        desired = {p for p, member in owners.items() if member == self._instance}
        for partition in list(self.owned):
            if partition not in desired:
                self._release_later(partition)

        for partition in sorted(desired - self.owned.keys() - self.releasing.keys()):
            try:
                revision = await self._kv.create(
                    self._lease_key(partition), self._instance.encode()
                )
            except KeyWrongLastSequenceError:
                continue  # still held by its previous owner; it releases it on its next tick
            self.owned[partition] = revision
            await self._on_acquire(partition)
        return set(self.owned)

    def _release_later(self, partition: int) -> None:
        if partition not in self.releasing:
            self.releasing[partition] = asyncio.create_task(
                self._give_up(partition), name=f"release-{self._group}-p{partition}"
            )

    async def _give_up(self, partition: int) -> None:
        """Drain (the lease is renewed meanwhile), then delete the lease if still ours."""
        try:
            await self._on_release(partition)
        except Exception:
            log.exception("releasing partition %d failed; giving its lease up anyway", partition)
        finally:
            async with self._lock:
                revision = self.owned.pop(partition, None)
                if revision is not None:
                    try:
                        await self._kv.delete(self._lease_key(partition), last=revision)
                    except (KeyWrongLastSequenceError, KeyNotFoundError):
                        log.debug("lease on partition %d already gone", partition)
                    except Exception:
                        log.warning("could not delete the lease of partition %d", partition)
            self.releasing.pop(partition, None)

    async def release_all(self) -> None:
        for partition in list(self.owned):
            self._release_later(partition)
        await asyncio.gather(*self.releasing.values(), return_exceptions=True)
        try:
            await self._kv.delete(f"{self._group}.members.{self._instance}")
        except KeyNotFoundError:
            log.debug("membership key already expired")
