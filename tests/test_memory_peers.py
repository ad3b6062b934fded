"""The memory tier's copies on another host (jitckpt.worker.memory_peers), in one process over loopback.

The whole path, a host lost and its ranks resumed from the copies, runs as two
jit-run "hosts" in tests/test_memory_tier.py; here each piece of the protocol
and its refusals: what is received is untrusted input.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from jitckpt.store import DiskStore, ParallelCoordinates, select
from jitckpt.store.shard import Sharding
from jitckpt.store.memory import MemoryStore, peer_copies
from jitckpt.store.tiered import TieredStore
from jitckpt.worker.memory_peers import _LENGTH, PeerCopies, PeerError, predecessor_of, successor_of


class FakeStore:
    """The job store's set/get/wait, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def wait(self, keys: list[str], timeout) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        while not all(k in self.data for k in keys):
            if time.monotonic() > deadline:
                raise TimeoutError(f"keys {keys} not set")
            time.sleep(0.01)


def _fsdp(rank: int) -> ParallelCoordinates:
    """Rank ``rank`` of two, each holding the only copy of its shard."""
    return ParallelCoordinates.from_layout(rank, 2).with_sharding([Sharding("parameters (FSDP2/DTensor)", (2,), (0, 1), (0,))])


def _snapshot(memory: MemoryStore, rank: int, step: int, payload: bytes = b"state") -> Path:
    pending = memory.begin_save(step, _fsdp(rank))
    pending.write_file("state.pt", payload + bytes([step]))
    pending.write_file("jitckpt-rng/rank-00000.bin", b"rng")
    return pending.commit({"reason": "memory-tier snapshot"})


def _pair(tmp_path: Path, timeout: float = 5.0) -> tuple[PeerCopies, PeerCopies]:
    """Ranks 0 and 1 of a job of two hosts with one rank each: each keeps the other's copies."""
    store = FakeStore()
    peers = [PeerCopies(MemoryStore(tmp_path / f"host{r}"), r, 2, 1, node=r, timeout=timeout) for r in (0, 1)]
    starts = [threading.Thread(target=p.start, args=(store, "jitckpt/memory-peers/round-1")) for p in peers]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    assert all(p._peer is not None for p in peers)
    return peers[0], peers[1]


def test_ring_over_nodes():
    assert [successor_of(r, 6, 2) for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert [predecessor_of(successor_of(r, 6, 2), 6, 2) for r in range(6)] == list(range(6))


def test_a_copy_arrives_whole_owner_only_and_verifiable_two_steps_kept(tmp_path):
    sender, receiver = _pair(tmp_path)
    try:
        for step in (3, 4, 5):
            snapshot = _snapshot(sender.memory, 0, step)
            assert sender.send(snapshot, step) > 0
        assert receiver.memory.list_steps() == [5, 4]  # two per rank
        copy = receiver.memory.root / "step-00000005" / "rank-00000"
        original = sender.memory.root / "step-00000005" / "rank-00000"
        assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == sorted(p.relative_to(original) for p in original.rglob("*"))
        assert receiver.memory.verify(copy).step == 5  # checksums and metadata as the sender committed them
        for path in [copy, *copy.rglob("*")]:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    finally:
        sender.close()
        receiver.close()


def test_the_successor_must_be_on_another_node(tmp_path):
    store = FakeStore()
    same = [PeerCopies(MemoryStore(tmp_path / f"r{r}"), r, 2, 1, node=0, timeout=5) for r in (0, 1)]
    errors = []

    def start(p):
        try:
            p.start(store, "x")
        except PeerError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=start, args=(p,)) for p in same]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2 and all("on this rank's own node 0" in e for e in errors), errors
    for p in same:
        p.close()


def test_a_successor_that_never_publishes_is_named(tmp_path):
    alone = PeerCopies(MemoryStore(tmp_path / "r0"), 0, 2, 1, node=0, timeout=0.3)
    with pytest.raises(PeerError, match="rank 1, which keeps this rank's copies, never said where it listens"):
        alone.start(FakeStore(), "x")
    alone.close()


def _raw_send(peer: PeerCopies, header: dict, body: bytes) -> str:
    with socket.create_connection(("127.0.0.1", peer._listener.getsockname()[1]), timeout=5) as conn:
        raw = json.dumps(header).encode()
        conn.sendall(_LENGTH.pack(len(raw)) + raw + body)
        try:
            return conn.recv(200).decode()
        except OSError as exc:
            return f"dropped: {exc}"


@pytest.mark.parametrize("header, body, answer", [
    ({"token": "wrong", "rank": 0, "step": 1, "files": [["state.pt", 3]]}, b"abc", "refused: not this job's token"),
    ({"token": None, "rank": 0, "step": 1, "files": [["../../escape", 3]]}, b"abc", ""),
    ({"token": None, "rank": 0, "step": 1, "files": [["/etc/x", 3]]}, b"abc", ""),
    ({"token": None, "rank": 1, "step": 1, "files": [["state.pt", 3]]}, b"abc", "refused: rank 1"),
    ({"token": None, "rank": 0, "step": -2, "files": [["state.pt", 3]]}, b"abc", "refused: rank 0, step -2"),
    ({"token": None, "rank": 0, "step": 1, "files": [["state.pt", 1 << 60]]}, b"", f"refused: {1 << 60} bytes"),
], ids=["foreign-token", "dot-dot", "absolute", "own-rank", "negative-step", "larger-than-shared-memory"])
def test_an_untrusted_copy_is_refused_and_nothing_is_written(tmp_path, header, body, answer):
    sender, receiver = _pair(tmp_path)
    try:
        if header["token"] is None:
            header["token"] = receiver.token
        got = _raw_send(receiver, header, body)
        assert got.startswith(answer), got
        assert receiver.memory.list_steps() == []
        assert not (tmp_path / "escape").exists() and not list(tmp_path.rglob("escape"))
    finally:
        sender.close()
        receiver.close()


def test_a_dead_successor_fails_the_send_quickly(tmp_path):
    sender, receiver = _pair(tmp_path, timeout=2.0)
    receiver.close()
    snapshot = _snapshot(sender.memory, 0, 1)
    started = time.monotonic()
    with pytest.raises(PeerError, match="sending the copy of minibatch 1 to rank 1 failed"):
        sender.send(snapshot, 1)
    assert time.monotonic() - started < 5
    sender.close()


def test_hand_over_puts_the_predecessors_copies_and_own_older_snapshots_where_every_host_reads(tmp_path):
    """Rank 0's host is lost: rank 1 saved minibatch 5 on disk and hands over rank 0's copies (5 and 4) and its
    own snapshot of 4; a fresh host sees minibatch 5 complete on the shared file system alone."""
    root = tmp_path / "ckpt"
    sender, receiver = _pair(tmp_path)
    try:
        for step in (4, 5):
            _snapshot(receiver.memory, 1, step)  # rank 1's own snapshots
        for step in (4, 5):
            sender.send(_snapshot(sender.memory, 0, step, b"zero"), step)
        disk = DiskStore(root)
        pending = disk.begin_save(5, _fsdp(1))
        pending.write_file("state.pt", b"jit save of rank 1")
        pending.commit({"reason": "test"})
        handed = receiver.hand_over(root, saved_step=5)
        assert handed == ["step-00000005/rank-00000", "step-00000004/rank-00000", "step-00000004/rank-00001"], handed
        fresh_host = TieredStore(disk, MemoryStore(tmp_path / "replacement"), peer_copies(root))
        info = select(fresh_host, _fsdp(0))
        assert info.step == 5 and info.path.is_relative_to(peer_copies(root).root), info
        assert receiver.hand_over(root, saved_step=5) == []  # never over a copy already there
    finally:
        sender.close()
        receiver.close()
