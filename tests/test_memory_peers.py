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


def _start_all(peers: list[PeerCopies], store: "FakeStore", prefix: str) -> None:
    """Start every rank's side at once (each waits in the store for the ranks that keep its copies)."""
    starts = [threading.Thread(target=p.start, args=(store, prefix)) for p in peers]
    for t in starts:
        t.start()
    for t in starts:
        t.join()


def _pair(tmp_path: Path, timeout: float = 5.0) -> tuple[PeerCopies, PeerCopies]:
    """Ranks 0 and 1 of a job of two hosts with one rank each: each keeps the other's copies."""
    store = FakeStore()
    peers = [PeerCopies(MemoryStore(tmp_path / f"host{r}"), r, 2, 1, node=r, timeout=timeout) for r in (0, 1)]
    _start_all(peers, store, "jitckpt/memory-peers/round-1")
    assert all(list(p._peers) == p.successors for p in peers)
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
    ({"token": None, "rank": 0, "step": 1, "files": [["../../escape", 3]]}, b"abc", None),
    ({"token": None, "rank": 0, "step": 1, "files": [["/etc/x", 3]]}, b"abc", None),
    ({"token": None, "rank": 5, "step": 1, "files": [["state.pt", 3]]}, b"abc", "refused: rank 5"),
    ({"token": None, "rank": 1, "step": 1, "files": [["state.pt", 3]]}, b"abc", "refused: rank 1"),
    ({"token": None, "rank": 0, "step": -2, "files": [["state.pt", 3]]}, b"abc", "refused: rank 0, step -2"),
    ({"token": None, "rank": 0, "step": 1, "files": [["state.pt", 1 << 60]]}, b"", f"refused: {1 << 60} bytes"),
], ids=["foreign-token", "dot-dot", "absolute", "not-kept-here", "own-rank", "negative-step",
        "larger-than-shared-memory"])
def test_an_untrusted_copy_is_refused_and_nothing_is_written(tmp_path, header, body, answer):
    sender, receiver = _pair(tmp_path)
    try:
        if header["token"] is None:
            header["token"] = receiver.token
        got = _raw_send(receiver, header, body)
        if answer is None:  # (a header naming a place outside the copy: the connection is dropped, unanswered)
            assert got == "" or got.startswith("dropped"), got
        else:
            assert got.startswith(answer), got
        assert receiver.memory.list_steps() == []
        assert not (tmp_path / "escape").exists() and not list(tmp_path.rglob("escape"))
    finally:
        sender.close()
        receiver.close()


def test_a_stream_that_ends_early_leaves_nothing_behind(tmp_path):
    sender, receiver = _pair(tmp_path)
    try:
        header = {"token": receiver.token, "rank": 0, "step": 2, "files": [["state.pt", 1000]]}
        with socket.create_connection(("127.0.0.1", receiver._listener.getsockname()[1]), timeout=5) as conn:
            raw = json.dumps(header).encode()
            conn.sendall(_LENGTH.pack(len(raw)) + raw + b"x" * 10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(receiver.memory.root.rglob(".*partial*")):
            time.sleep(0.05)  # (wait for the receiver to have started, then for it to have given up)
        time.sleep(0.3)
        assert not list(receiver.memory.root.rglob("*partial*")) and receiver.memory.list_steps() in ([], [2])
        assert not list(receiver.memory.root.rglob("rank-*"))
    finally:
        sender.close()
        receiver.close()


def test_a_hand_over_goes_on_past_a_copy_that_fails(tmp_path, monkeypatch):
    from jitckpt.worker import memory_peers

    sender, receiver = _pair(tmp_path)
    try:
        for step in (4, 5):
            sender.send(_snapshot(sender.memory, 0, step), step)
            _snapshot(receiver.memory, 1, step)
        original = memory_peers.copy_private

        def failing(source, target):
            if source.parent.name == "step-00000005" and source.name == "rank-00000":
                raise OSError("disk full")
            original(source, target)

        monkeypatch.setattr(memory_peers, "copy_private", failing)
        with pytest.raises(memory_peers.HandOverError) as caught:
            receiver.hand_over(tmp_path / "ckpt", saved_step=None)
        assert caught.value.failed == ["step-00000005/rank-00000: disk full"]
        assert caught.value.handed == ["step-00000004/rank-00000", "step-00000005/rank-00001", "step-00000004/rank-00001"]
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
        previous = os.umask(0)  # whatever the umask, everything handed over is owner-only
        try:
            handed = receiver.hand_over(root, saved_step=5)
        finally:
            os.umask(previous)
        for path in [p for p in (root / ".jitckpt").rglob("*")]:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
        assert handed == ["step-00000005/rank-00000", "step-00000004/rank-00000", "step-00000004/rank-00001"], handed
        fresh_host = TieredStore(disk, MemoryStore(tmp_path / "replacement"), peer_copies(root))
        info = select(fresh_host, _fsdp(0))
        assert info.step == 5 and info.path.is_relative_to(peer_copies(root).root), info
        # An earlier attempt's hand-over left rank 0's snapshot of minibatch 9 (another timeline): it goes.
        stale = peer_copies(root).root / "step-00000009" / "rank-00000"
        stale.mkdir(parents=True)
        (stale.parent / ".rank-00000.handed-over").write_text("round-0")  # (an earlier attempt's note)
        # Another survivor keeping copies of rank 0 too (JITCKPT_MEMORY_COPIES=2) handed over its 6 in this
        # attempt: it stays.
        other = peer_copies(root).root / "step-00000006" / "rank-00000"
        other.mkdir(parents=True)
        (other.parent / ".rank-00000.handed-over").write_text(receiver.generation)
        assert receiver.generation
        assert receiver.hand_over(root, saved_step=5) == handed  # again: each copy replaced, none left as it was
        assert not stale.exists() and other.exists()
    finally:
        sender.close()
        receiver.close()


# ----- xor: one parity per group of hosts ----------------------------------------------------------


def test_parity_groups_never_keep_their_parities_on_a_member_node():
    from jitckpt.worker.memory_peers import parity_group

    # 3 nodes of 1 rank, groups of 2: {0, 1} -> parity on rank 2; {2} -> on rank 0
    assert [parity_group(r, 3, 1, 2) for r in range(3)] == [(0, [0, 1], [2]), (0, [0, 1], [2]), (1, [2], [0])]
    # 4 nodes of 2 ranks, groups of 3 nodes: local rank 1 of nodes 0-2 -> parity on node 3's local rank 1
    assert parity_group(3, 8, 2, 3) == (1, [1, 3, 5], [7]) and parity_group(7, 8, 2, 3) == (3, [7], [1])
    # rs, 4 nodes of 1 rank, 2 data + 2 parities: {0, 1} -> parities on 2 and 3; {2, 3} -> on 0 and 1
    assert [parity_group(r, 4, 1, 2, 2) for r in (0, 3)] == [(0, [0, 1], [2, 3]), (1, [2, 3], [0, 1])]
    for world, local, size, m in ((6, 1, 2, 1), (12, 2, 5, 1), (8, 2, 3, 1), (6, 1, 3, 2), (10, 2, 2, 3), (5, 1, 2, 2)):
        for rank in range(world):
            _, members, holders = parity_group(rank, world, local, size, m)
            nodes = {m // local for m in members}
            assert rank in members and len(holders) == m and len({h // local for h in holders} | nodes) == len(nodes) + m
    with pytest.raises(PeerError, match="needs 3 nodes or more"):
        parity_group(0, 2, 1, 2)
    with pytest.raises(PeerError, match="needs 4 nodes or more"):
        parity_group(0, 3, 1, 2, 2)


def test_blob_round_trip_and_parity_rebuild_of_one_lost_member(tmp_path):
    import numpy as np

    from jitckpt.store.parity import blob_of, digest, rebuild, write_parity, xor_into

    memory = MemoryStore(tmp_path / "host")
    snaps = {rank: _snapshot(memory, rank % 2, 7, bytes([rank]) * (100 + 50 * rank)) for rank in (0, 1)}
    parity = np.zeros(0, np.uint8)
    members = {}
    for rank, snap in snaps.items():
        blob = blob_of(snap)
        parity = xor_into(parity, blob)
        members[rank] = (len(blob), digest(blob))
    parity_root, copies = tmp_path / "parity", tmp_path / "copies"
    write_parity(parity_root, 7, 0, parity, members)
    # rank 0's snapshot handed over, rank 1's lost with its host
    (copies / "step-00000007").mkdir(parents=True)
    import shutil
    shutil.copytree(snaps[0], copies / "step-00000007" / "rank-00000")
    done, failed = rebuild(parity_root, copies)
    assert done == ["step-00000007/rank-00001 from XOR parity"] and failed == []
    rebuilt = copies / "step-00000007" / "rank-00001"
    assert blob_of(rebuilt) == blob_of(snaps[1])
    assert DiskStore(copies).verify(rebuilt).step == 7  # the snapshot's own checksums hold
    for path in [rebuilt, *rebuilt.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert rebuild(parity_root, copies) == ([], [])  # nothing left to rebuild


def test_parity_rebuild_refuses_two_lost_members_and_a_corrupt_parity(tmp_path):
    import numpy as np

    from jitckpt.store.parity import blob_of, digest, rebuild, write_parity, xor_into

    memory = MemoryStore(tmp_path / "host")
    snaps = {rank: _snapshot(memory, rank % 2, 3, bytes([rank + 1]) * 64) for rank in (0, 1)}
    blobs = {rank: blob_of(s) for rank, s in snaps.items()}
    parity = xor_into(xor_into(np.zeros(0, np.uint8), blobs[0]), blobs[1])
    members = {rank: (len(b), digest(b)) for rank, b in blobs.items()}
    write_parity(tmp_path / "parity", 3, 0, parity, members)
    (tmp_path / "copies").mkdir()
    done, failed = rebuild(tmp_path / "parity", tmp_path / "copies")
    assert done == [] and len(failed) == 1 and "ranks 0, 1 of one XOR group are all lost" in failed[0], failed
    import shutil
    shutil.copytree(snaps[0], tmp_path / "copies" / "step-00000003" / "rank-00000")
    file = tmp_path / "parity" / "step-00000003" / "group-0.parity"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x40
    file.write_bytes(bytes(data))
    done, failed = rebuild(tmp_path / "parity", tmp_path / "copies")
    assert done == [] and "does not match its digest" in failed[0], failed
    assert not (tmp_path / "copies" / "step-00000003" / "rank-00001").exists()


def test_xor_copies_over_the_wire_make_a_parity_that_rebuilds(tmp_path):
    """Three hosts of one rank, groups of two: ranks 0 and 1 send their snapshots to rank 2, which keeps only
    their parity; with rank 1's host lost, rank 2's and rank 0's hand-over rebuild rank 1's snapshot."""
    from jitckpt.store.parity import blob_of, rebuild
    from jitckpt.store.memory import parity_area

    store = FakeStore()
    peers = [PeerCopies(MemoryStore(tmp_path / f"host{r}"), r, 3, 1, node=r, timeout=5, scheme="xor", group_size=2)
             for r in range(3)]
    _start_all(peers, store, "x")
    try:
        assert [p.successors for p in peers] == [[2], [2], [0]]
        for step in (4, 5):
            for rank in (0, 1):
                peers[rank].send(_snapshot(peers[rank].memory, rank, step, bytes([rank, step]) * (300 + rank)), step)
        held = sorted(p.relative_to(peers[2].parity_root).as_posix() for p in peers[2].parity_root.rglob("*.json"))
        assert held == ["step-00000004/group-0.json", "step-00000005/group-0.json"], held
        assert peers[2].memory.list_steps() == []  # no copies: the parity only
        root = tmp_path / "ckpt"
        assert "step-00000005/group-0" in peers[2].hand_over(root, saved_step=5)
        assert "step-00000005/rank-00000" in peers[0].hand_over(root, saved_step=5)  # xor: every own snapshot
        done, failed = rebuild(parity_area(root), peer_copies(root).root)
        assert sorted(done) == ["step-00000004/rank-00001 from XOR parity",
                                "step-00000005/rank-00001 from XOR parity"] and not failed, (done, failed)
        original = peers[1].memory.root / "step-00000005" / "rank-00001"
        assert blob_of(peer_copies(root).root / "step-00000005" / "rank-00001") == blob_of(original)
    finally:
        for p in peers:
            p.close()


# ----- rs: m Reed-Solomon parities per group of hosts (ISA-L) ---------------------------------------


def test_isal_codes_rebuild_any_m_lost_blobs_of_different_lengths():
    """The ISA-L binding: parities built one blob at a time equal those encoded at once, and every choice of
    m lost among the k + m blobs and parities gives the data back."""
    import itertools

    import numpy as np

    from jitckpt.store import isal

    rng = np.random.default_rng(3)
    k, m = 3, 2
    blobs = [rng.integers(0, 256, 4000 + 1234 * i, dtype=np.uint8) for i in range(k)]
    size = max(map(len, blobs))
    padded = [np.concatenate([b, np.zeros(size - len(b), np.uint8)]) for b in blobs]
    rows = [np.zeros(0, np.uint8) for _ in range(m)]
    for row in range(m):
        for index in (2, 0, 1):  # (in any order of arrival)
            rows[row] = isal.update(rows[row], blobs[index], k, m, row, index)
    assert all(np.array_equal(a, b) for a, b in zip(rows, isal.encode(padded, m)))
    assert not all(np.array_equal(rows[0], x) for x in (rows[1], padded[0] ^ padded[1] ^ padded[2]))
    for lost in itertools.combinations(range(k + m), m):
        present = {i: padded[i] for i in range(k) if i not in lost} | {k + j: rows[j] for j in range(m) if k + j not in lost}
        data = [i for i in lost if i < k]
        out = isal.decode(k, m, present, data)
        assert all(np.array_equal(out[i], padded[i]) for i in data), lost
    with pytest.raises(ValueError, match="2 of the 3 blobs needed"):
        isal.decode(k, m, {0: padded[0], k: rows[0]}, [1, 2])


def test_rs_copies_over_the_wire_rebuild_two_lost_hosts_and_refuse_three(tmp_path):
    """Four hosts of one rank, 2 data + 2 parities: ranks 0 and 1 send their snapshots to ranks 2 and 3, which
    keep one Reed-Solomon parity each (no copies).  With hosts 0 and 1 both lost, the parities alone rebuild
    both snapshots; with a parity corrupted, the rebuild is refused by digest; with hosts 0, 1 and 2 lost, it
    names the ranks and how many parities survive."""
    import shutil

    from jitckpt.store.parity import blob_of, rebuild
    from jitckpt.store.memory import parity_area

    store = FakeStore()
    peers = [PeerCopies(MemoryStore(tmp_path / f"host{r}"), r, 4, 1, node=r, timeout=5, scheme="rs", group_size=2,
                        parities=2) for r in range(4)]
    _start_all(peers, store, "rs")
    try:
        assert [p.successors for p in peers] == [[2, 3], [2, 3], [0, 1], [0, 1]]
        assert [sorted(p.keeps_for) for p in peers] == [[2, 3], [2, 3], [0, 1], [0, 1]]
        # both at once, as in a job (each arrives on its own thread), rank 1's longer: the parity grows meanwhile
        senders = [threading.Thread(target=peers[rank].send, args=(
            _snapshot(peers[rank].memory, rank, 6, bytes(range(rank, 256)) * (24000 + 9000 * rank)), 6))
            for rank in (0, 1)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        for holder, row in ((2, 0), (3, 1)):
            held = sorted(p.relative_to(peers[holder].parity_root).as_posix() for p in peers[holder].parity_root.rglob("*.json"))
            assert held == [f"step-00000006/group-0.row-{row}.json"], held
            assert peers[holder].memory.list_steps() == []  # no copies: a parity only
        root = tmp_path / "ckpt"
        # An earlier worker of rank 2 left a parity of minibatch 9 in its host's memory (a timeline a failure
        # cut short), and an earlier attempt handed one over for minibatch 3: neither is handed over now.
        shutil.copytree(peers[2].parity_root / "step-00000006", peers[2].parity_root / "step-00000009")
        shutil.copytree(peers[2].parity_root / "step-00000006", parity_area(root) / "step-00000003")
        for holder in (2, 3):
            handed = peers[holder].hand_over(root, saved_step=6)
            assert handed == [f"step-00000006/group-0.row-{holder - 2}"], handed
        assert not (parity_area(root) / "step-00000009").exists()
        assert not list((parity_area(root) / "step-00000003").iterdir())
        done, failed = rebuild(parity_area(root), peer_copies(root).root)
        assert sorted(done) == ["step-00000006/rank-00000 from Reed-Solomon parities",
                                "step-00000006/rank-00001 from Reed-Solomon parities"] and not failed, (done, failed)
        for rank in (0, 1):
            original = peers[rank].memory.root / "step-00000006" / rank_name(rank)
            assert blob_of(peer_copies(root).root / "step-00000006" / rank_name(rank)) == blob_of(original)
        # a corrupted parity: never a wrong snapshot
        shutil.rmtree(peer_copies(root).root)
        file = parity_area(root) / "step-00000006" / "group-0.row-0.parity"
        data = bytearray(file.read_bytes())
        data[100] ^= 1
        file.write_bytes(bytes(data))
        done, failed = rebuild(parity_area(root), peer_copies(root).root)
        assert done == [] and "does not match its digest" in failed[0], failed
        # three hosts lost: one parity left for two lost ranks
        file.unlink()
        done, failed = rebuild(parity_area(root), peer_copies(root).root)
        assert done == [] and "ranks 0, 1 of one Reed-Solomon group are lost and 1 of its parities survive" in failed[0]
    finally:
        for p in peers:
            p.close()


def rank_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def test_rs_rebuild_never_mixes_parities_of_another_timeline_and_survives_a_bad_row(tmp_path):
    """A parity row left by a timeline a failure cut short (other digests) beside this timeline's: the rebuild
    uses the rows that agree with the members at hand, never a mix; an unreadable or out-of-range row is
    named and the others still rebuild."""
    import json
    import shutil

    import numpy as np

    from jitckpt.store import isal
    from jitckpt.store.parity import blob_of, digest, rebuild, write_parity

    memory = MemoryStore(tmp_path / "host")
    snaps = {rank: _snapshot(memory, rank, 8, bytes([rank + 3]) * (5000 + 700 * rank)) for rank in (0, 1)}
    blobs = {rank: blob_of(s) for rank, s in snaps.items()}
    members = {rank: (len(b), digest(b)) for rank, b in blobs.items()}
    root = tmp_path / "parity"
    for row in (0, 1):
        parity = np.zeros(0, np.uint8)
        for index, rank in enumerate((0, 1)):
            parity = isal.update(parity, blobs[rank], 2, 2, row, index)
        write_parity(root, 8, 0, parity, members, {"k": 2, "m": 2, "row": row, "index": {0: 0, 1: 1}})
    # row 1 as another timeline left it: rank 1's blob had another digest there
    stale = json.loads((root / "step-00000008" / "group-0.row-1.json").read_text())
    stale["members"]["1"]["blake2b"] = "0" * 32
    (root / "step-00000008" / "group-0.row-1.json").write_text(json.dumps(stale))
    (root / "step-00000008" / "group-0.row-7.json").write_text(json.dumps(stale | {"row": 7}))  # (row >= m)
    (root / "step-00000008" / "group-0.row-7.parity").write_bytes(b"\0" * 10)
    copies = tmp_path / "copies"
    (copies / "step-00000008").mkdir(parents=True)
    shutil.copytree(snaps[1], copies / "step-00000008" / "rank-00001")  # rank 0 lost, rank 1 at hand
    done, failed = rebuild(root, copies)
    assert done == ["step-00000008/rank-00000 from Reed-Solomon parities"], (done, failed)
    assert len(failed) == 1 and "group-0.row-7.json: unreadable" in failed[0], failed
    assert blob_of(copies / "step-00000008" / "rank-00000") == blobs[0]
