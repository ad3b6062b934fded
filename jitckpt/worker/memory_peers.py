"""The memory tier across hosts: every rank's snapshot kept, as a copy or in a parity, by a rank of another host.

Why.  A rank's snapshots live in its host's shared memory
(``jitckpt.store.memory``): they outlive the rank's process, not its host.
In a multi-node job a lost host takes its ranks' only snapshots with it, and
the replacement host's ranks could not see the survivors' shared memory
anyway.  So each snapshot also leaves its host, by one of two schemes
(``JITCKPT_MEMORY_REDUNDANCY``):

- ``replicate``: copies kept by ranks of other hosts (Deadpool's ring
  replication, placed as Gemini places its checkpoints): rank ``r``'s
  ``c`` copies (``JITCKPT_MEMORY_COPIES``, default 1) go to the same local
  rank on the next ``c`` nodes (``r + j LOCAL_WORLD_SIZE`` modulo the world
  size, torchrun's node-contiguous ranks).  Any ``c`` lost hosts never take
  a shard with all its copies; ``c + 1`` neighbouring hosts of the ring can.
- ``xor``: one XOR parity per group (REFT's scheme, across hosts): runs of
  ``G`` consecutive nodes, the ranks of one local rank on a run forming a
  group (``parity_group``), whose parity the same local rank on the node after
  the run keeps (``jitckpt.store.parity``).  Memory: a parity instead of a
  copy each; one member per group can be rebuilt.
- ``rs``: ``m`` Cauchy Reed-Solomon parities per group (ECHECK's scheme,
  ``jitckpt.store.isal``): runs of ``k`` nodes as with ``xor``, parity ``j``
  kept by the same local rank on the ``j``-th node after the run.  Any ``m``
  lost hosts are survived (``k + m`` nodes needed); each snapshot travels
  ``m`` times and each holder keeps one parity per group.

Every rank checks, through the job's store, that the ranks keeping its
copies are on other nodes, else the copies are refused with a message.

Transport.  Its own TCP connections, not the job's process groups: the copies
never sit between the training's collectives in any group's order, need no
collective to set up, and a dead or frozen peer only fails this connection.
Each rank listens on an ephemeral port of every interface and publishes its
address, node and a random token under
``jitckpt/memory-peers/<generation>/<rank>`` in the job's store (the
generation as in ``jitckpt.worker.step_agreement``); a copy carrying another
token is refused.  A message is a length-prefixed JSON header (rank, step,
token, relative file paths and sizes) followed by the files' bytes; the
receiver checks each path (no absolute paths, no ``..``), writes the files
owner-only under a hidden name, renames the rank directory into its memory
store (``step-N/rank-R``, checksums and metadata as the sender committed
them), keeps two steps per rank, and answers ``ok``.  Nothing received is
ever executed; a copy is verified against its checksums when it is selected.

When.  Right after the snapshot is committed, on a thread of its own: the
copy overlaps the minibatch's forward and backward, and the next snapshot
first waits for it to end (at most one copy in flight per rank, so the
copies are never more than one minibatch behind).  A host lost after its
copy of minibatch i landed costs one minibatch, as a lost process does; a
host lost while that copy was still on its way costs two (the copies of
i-1 are complete).

Hand-over.  At a JIT event every surviving rank copies what a lost host's
ranks need from its host's memory to the shared file system: with
``replicate``, the copies it keeps of its predecessors and its own snapshots
of the newest two minibatches (not the one its JIT save just wrote), into
``<checkpoint root>/.jitckpt/from-peer-memory``
(``jitckpt.store.memory.peer_copies``), a tier every rank's selection
reads; with ``xor`` and ``rs``, the parities this worker published
(``parity_area``; never an earlier worker's, and what an earlier attempt
handed over under their names goes first) and all its own snapshots, from
which every restarted rank rebuilds, before it selects, the lost members of
a group (``MemorySnapshots.rebuild``).  The JIT event first freezes what the
host keeps: a copy that arrives later is refused, and the hand-over waits
for the ones being committed.  A replacement host's ranks then find their
shards at the step the others resume from, and the step agreement settles
any difference between hosts' views.  It costs up to four shard writes per
surviving rank, at a failure only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import struct
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from jitckpt import eventlog
from jitckpt.store.disk import DiskStore, rank_dir_name, step_dir
from jitckpt.store.memory import MemoryStore, copy_private, copy_private_file, install_rank_copy, parity_area, peer_copies
from jitckpt.store import isal
from jitckpt.store.parity import blob_header, checked_files, digest, files_of, parities, write_parity, xor_into
from jitckpt.store.parity import prune as prune_parities
from jitckpt.store.private import make_private_dir, open_private_file, write_private_file

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

KEY_PREFIX = "jitckpt/memory-peers"
SCHEMES = ("replicate", "xor", "rs")
MAX_GROUP = 8  # nodes per XOR or Reed-Solomon group by default (fewer if the job has fewer)
DEFAULT_RS_PARITIES = 2
PARITY_SUBDIR = "parity"  # beside the memory tier's snapshots: the parities this host keeps
_LENGTH = struct.Struct("!Q")
_MAX_HEADER = 1 << 22  # bytes of JSON: a file list, never more
_CHUNK = 1 << 20


_FROZEN = "refused: a JIT event is under way here"


class _Frozen(Exception):
    """A copy received after a JIT event froze this host's memory tier: not committed."""


class PeerError(Exception):
    """A copy could not be sent or was refused: the reason, for the log."""


class HandOverError(Exception):
    """Some of what a hand-over should have copied could not be: what was, and what failed (each with why)."""

    def __init__(self, handed: list[str], failed: list[str]) -> None:
        super().__init__(f"{len(failed)} could not be handed over: {'; '.join(failed)}")
        self.handed, self.failed = handed, failed


def is_multi_node(rt: "JitRuntime") -> bool:
    """Whether this job's ranks are on more than one node (so shared memory is not shared by all of them)."""
    return rt.world_size > rt.local_world_size


def successor_of(rank: int, world_size: int, local_world_size: int, hops: int = 1) -> int:
    """A rank that keeps ``rank``'s copies: the same local rank ``hops`` nodes on (torchrun's rank order)."""
    return (rank + hops * local_world_size) % world_size


def predecessor_of(rank: int, world_size: int, local_world_size: int, hops: int = 1) -> int:
    """A rank whose copies ``rank`` keeps: the same local rank ``hops`` nodes back."""
    return (rank - hops * local_world_size) % world_size


def parity_group(rank: int, world_size: int, local_world_size: int, group_size: int,
                 parities: int = 1) -> tuple[int, list[int], list[int]]:
    """``xor`` and ``rs``: (the group's number, its members, the ranks that keep its parities) for ``rank``.

    The nodes are cut into runs of ``group_size`` consecutive nodes (the last
    run may be shorter); a group is the ranks of one local rank on one run,
    and its ``parities`` parities go to that local rank on the nodes after the
    run, never a node of the group (``group_size + parities`` <= nodes).
    """
    nodes = world_size // local_world_size
    if not (1 <= group_size and 1 <= parities and group_size + parities <= nodes):
        raise PeerError(f"a group of {group_size} nodes with {parities} parit{'y' if parities == 1 else 'ies'} "
                        f"elsewhere needs {group_size + parities} nodes or more (the job has {nodes})")
    node, local = divmod(rank, local_world_size)
    run = node // group_size
    first, end = run * group_size, min((run + 1) * group_size, nodes)
    number = run * local_world_size + local
    members = [n * local_world_size + local for n in range(first, end)]
    return number, members, [((end + j) % nodes) * local_world_size + local for j in range(parities)]


class PeerCopies:
    """This rank's side of the copies across hosts (see the module docstring)."""

    def __init__(self, memory: MemoryStore, rank: int, world_size: int, local_world_size: int, node: int,
                 timeout: float, scheme: str = "replicate", group_size: int = 0, parities: int = 0,
                 copies: int = 1) -> None:
        if scheme not in SCHEMES:
            raise PeerError(f"no redundancy scheme {scheme!r} (one of {', '.join(SCHEMES)})")
        self.memory = memory
        self.parity_root = memory.root.parent / PARITY_SUBDIR
        self.rank = rank
        self.node = node
        self.scheme = scheme
        self.parities = 0
        # The ranks whose snapshots this rank keeps (a copy, or in a parity): copies of any other are refused.
        self._holds: dict[int, tuple[list[int], int]] = {}  # group -> (its members, the parity row kept here)
        if scheme in ("xor", "rs"):
            if scheme == "rs":
                try:
                    isal.library()
                except isal.IsalUnavailable as exc:
                    raise PeerError(str(exc)) from None
            self.parities = 1 if scheme == "xor" else (parities or DEFAULT_RS_PARITIES)
            nodes = world_size // max(local_world_size, 1)
            group_size = group_size or max(1, min(nodes - self.parities, MAX_GROUP))
            self.group, self.members, self.successors = parity_group(rank, world_size, local_world_size,
                                                                     group_size, self.parities)
            for r in range(rank % local_world_size, world_size, local_world_size):
                group, members, holders = parity_group(r, world_size, local_world_size, group_size, self.parities)
                if rank in holders:
                    self._holds[group] = (members, holders.index(rank))
            self.keeps_for = {m for members, _ in self._holds.values() for m in members}
        else:
            nodes = world_size // max(local_world_size, 1)
            if not 1 <= copies < nodes:
                raise PeerError(f"{copies} cop{'y' if copies == 1 else 'ies'} of each snapshot on other hosts need "
                                f"{copies + 1} nodes or more (the job has {nodes})")
            self.group, self.members = None, [rank]
            self.successors = [successor_of(rank, world_size, local_world_size, j) for j in range(1, copies + 1)]
            self.keeps_for = {predecessor_of(rank, world_size, local_world_size, j) for j in range(1, copies + 1)}
        self._accumulating: dict[tuple[int, int], dict] = {}  # (step, group) -> the parity so far (receiving)
        self._folding = threading.Lock()  # (each sender has its own receiving thread; one parity, one writer)
        # A JIT event freezes what this host keeps: no copy is committed after it, and the hand-over waits for
        # the commits (renames, folds, prunes; never a transfer) under way when it came.
        self._state = threading.Condition()
        self._frozen = False
        self._committing = 0
        self._parities_written: set[tuple[int, str]] = set()  # (step, parity name) this process published
        self.generation = ""  # this attempt's, from the job store's prefix (``start``)
        self.timeout = timeout
        self.token = secrets.token_hex(16)
        self._listener: socket.socket | None = None
        self._peers: dict[int, dict] = {}  # the successors' published entries
        self._conns: dict[int, socket.socket] = {}
        self._seen: set[int] = set()  # ranks whose first copy this process received (it drops their later steps)
        self._received: set[tuple[int, int]] = set()  # (rank, step) of the copies this process received
        self._idle = threading.Event()  # no copy in flight
        self._idle.set()
        self.sent = 0

    # ----- set-up ----------------------------------------------------------------------

    @staticmethod
    def publish_off(store: Any, prefix: str, rank: int, why: str) -> None:
        """Say in the job's store that ``rank`` keeps no copies (so that the rank sending to it need not wait)."""
        store.set(f"{prefix}/{rank}", json.dumps({"off": why}))

    def start(self, store: Any, prefix: str) -> None:
        """Listen for the copies this rank keeps, publish where under ``prefix`` in the job's ``store``, and
        find the successors there (waiting at most ``timeout`` seconds for them); raises PeerError."""
        self.generation = prefix.rsplit("/", 1)[-1]
        listener = socket.create_server(("0.0.0.0", 0))
        self._listener = listener
        entry = {"host": _my_address(), "port": listener.getsockname()[1], "node": self.node, "token": self.token}
        store.set(f"{prefix}/{self.rank}", json.dumps(entry))
        threading.Thread(target=self._serve, name="jitckpt-memory-peers", daemon=True).start()
        for successor in self.successors:
            key = f"{prefix}/{successor}"
            try:
                store.wait([key], timedelta(seconds=self.timeout))
                peer = json.loads(store.get(key))
            except Exception as exc:  # (a timeout, a store that went away)
                raise PeerError(f"rank {successor}, which keeps this rank's copies, never said where it listens "
                                f"({type(exc).__name__}: {exc})") from None
            if "off" in peer:
                raise PeerError(f"rank {successor}, which would keep this rank's copies, keeps none ({peer['off']})")
            if peer.get("node") == self.node:
                raise PeerError(f"rank {successor} is on this rank's own node {self.node}, so its copies would "
                                f"die with this host (ranks not placed node by node?)")
            self._peers[successor] = peer

    # ----- sending ---------------------------------------------------------------------

    def send(self, snapshot: Path, step: int) -> int:
        """Copy the committed snapshot ``snapshot`` of minibatch ``step`` to every successor; returns the bytes
        sent.  PeerError names each successor that did not take it (after trying every one)."""
        listing = [list(f) for f in files_of(snapshot)]
        files = [snapshot / path for path, _ in listing]
        sent, errors = 0, []
        for successor in self.successors:
            header = {"token": self._peers[successor]["token"], "rank": self.rank, "step": step,
                      "scheme": self.scheme, "files": listing}
            try:
                sent += self._send_to(successor, header, files)
            except PeerError as exc:
                errors.append(str(exc))
        if errors:
            raise PeerError("; ".join(errors))
        self.sent += 1
        return sent

    def _send_to(self, successor: int, header: dict, files: list[Path]) -> int:
        step = header["step"]
        for attempt in (1, 2):  # (once more on a fresh connection: the successor may have restarted its side)
            try:
                conn = self._connection(successor)
                raw = json.dumps(header).encode()
                conn.sendall(_LENGTH.pack(len(raw)) + raw)
                for f in files:
                    with open(f, "rb") as fh:
                        conn.sendfile(fh)
                answer = _read_line(conn)
            except OSError as exc:
                self._close(successor)
                if attempt == 2:
                    raise PeerError(f"sending the copy of minibatch {step} to rank {successor} failed "
                                    f"({type(exc).__name__}: {exc})") from None
                continue
            if answer != "ok":
                raise PeerError(f"rank {successor} refused the copy of minibatch {step}: {answer}")
            return sum(size for _, size in header["files"])
        raise AssertionError("unreachable")

    def send_in_background(self, snapshot: Path, step: int,
                           done: Callable[[int | None, str | None, float], None]) -> None:
        """Start copying ``snapshot`` on a thread of its own; it calls ``done(bytes sent or None, the error or
        None, seconds)`` when the copy ends.  The previous copy must have ended (``wait_sent``)."""
        self._idle.clear()

        def copy() -> None:
            started = time.perf_counter()
            try:
                size, error = self.send(snapshot, step), None
            except PeerError as exc:
                size, error = None, str(exc)
            try:
                done(size, error, time.perf_counter() - started)
            finally:
                self._idle.set()

        threading.Thread(target=copy, name="jitckpt-memory-copy", daemon=True).start()

    def wait_sent(self, timeout: float) -> bool:
        """Wait for the copy in flight, if any, to end; False if it is still going after ``timeout`` seconds."""
        return self._idle.wait(timeout)

    def _connection(self, successor: int) -> socket.socket:
        if successor not in self._conns:
            peer = self._peers[successor]
            self._conns[successor] = socket.create_connection((peer["host"], peer["port"]), timeout=self.timeout)
        return self._conns[successor]

    def _close(self, successor: int | None = None) -> None:
        for rank in [successor] if successor is not None else list(self._conns):
            conn = self._conns.pop(rank, None)
            if conn is not None:
                conn.close()

    # ----- receiving -------------------------------------------------------------------

    def _serve(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._listener.fileno() < 0:
                    return  # (closed)
                time.sleep(0.1)  # (out of descriptors, a connection reset before it was accepted: go on)
                continue
            conn.settimeout(max(4 * self.timeout, 60.0))  # (an idle or silent connection ends; senders reconnect)
            threading.Thread(target=self._receive_from, args=(conn,), name="jitckpt-memory-peer", daemon=True).start()

    def _receive_from(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    raw = _read_exact(conn, _LENGTH.size, allow_eof=True)
                    if raw is None:
                        return
                    answer, go_on = self._receive_one(conn, _LENGTH.unpack(raw)[0])
                except (OSError, ValueError, RecursionError) as exc:
                    eventlog.record("memory_peer_refused", rank=self.rank, error=f"{type(exc).__name__}: {exc}")
                    return  # (a broken stream cannot be resynchronised: the sender reconnects)
                try:
                    conn.sendall(answer.encode() + b"\n")
                except OSError:
                    return
                if not go_on:
                    return

    def _receive_one(self, conn: socket.socket, length: int) -> tuple[str, bool]:
        """One copy: (the answer, whether the connection may carry another)."""
        if length > _MAX_HEADER:
            raise ValueError(f"a header of {length} bytes")
        header = json.loads(_read_exact(conn, length))
        if not isinstance(header, dict) or header.get("token") != self.token:
            return "refused: not this job's token", False  # (nothing more is read from a stranger)
        files = checked_files(header.get("files"))
        rank, step = header.get("rank"), header.get("step")
        total = sum(size for _, size in files)
        free = _free_bytes(self.memory.root)
        if free is not None and 2 * total > free:  # (room to spare: the job's own snapshots, NCCL, DataLoaders)
            return f"refused: {total} bytes, {free} free in this host's shared memory", False
        if not isinstance(step, int) or step < 0 or rank not in self.keeps_for:
            _drain(conn, total)
            return f"refused: rank {rank!r}, step {step!r} (this rank keeps copies of rank(s) {sorted(self.keeps_for)})", True
        if self._frozen:
            _drain(conn, total)
            return _FROZEN, True
        if self.scheme in ("xor", "rs"):
            return self._accumulate(conn, rank, step, files), True
        committing = False

        def fill(partial: Path) -> None:  # straight from the socket into the files: no copy held in memory
            nonlocal committing
            make_private_dir(partial)
            for parts, size in files:
                if len(parts) > 1:
                    make_private_dir(partial.joinpath(*parts[:-1]), parents=True)
                fd = open_private_file(partial.joinpath(*parts), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                try:
                    _receive_into(conn, fd, size)
                finally:
                    os.close(fd)
            committing = self._begin_commit()
            if not committing:
                raise _Frozen

        try:
            # (replacing a copy of that step an earlier worker received: this timeline's is the one to keep)
            install_rank_copy(self.memory.root, step, rank_dir_name(rank), fill, replace=True)
            self.memory.prune_rank(rank, step, drop_later=rank not in self._seen)
            self._seen.add(rank)
            self._received.add((rank, step))
        except _Frozen:
            return _FROZEN, True
        finally:
            if committing:
                self._end_commit()
        return "ok", True

    def _begin_commit(self) -> bool:
        """A received copy is about to change what this host keeps: False if a JIT event froze it."""
        with self._state:
            if self._frozen:
                return False
            self._committing += 1
            return True

    def _end_commit(self) -> None:
        with self._state:
            self._committing -= 1
            self._state.notify_all()

    def _freeze(self) -> None:
        """No copy is committed from now on; wait (a little) for those being committed."""
        with self._state:
            self._frozen = True
            self._state.wait_for(lambda: self._committing == 0, timeout=max(self.timeout, 1.0))

    def _accumulate(self, conn: socket.socket, rank: int, step: int, files: list[tuple[list[str], int]]) -> str:
        """``xor``, ``rs``: fold one member's snapshot into the parity of its group kept here; the parity is
        published once every member's snapshot of the step is in.  The group, its members and the row come
        from this rank's own view of the layout, never from the message."""
        header = blob_header([("/".join(parts), size) for parts, size in files])
        blob = bytearray(len(header) + sum(size for _, size in files))  # (filled in place: no copy of a copy)
        blob[:len(header)] = header
        _fill(conn, memoryview(blob)[len(header):])
        group, (members, row) = next((g, held) for g, held in self._holds.items() if rank in held[0])
        blob_digest = digest(blob)  # (outside the lock: the other senders' folds need not wait for it)
        if not self._begin_commit():
            return _FROZEN
        try:
            with self._folding:
                return self._fold(blob, blob_digest, rank, step, group, members, row)
        finally:
            self._end_commit()

    def _fold(self, blob: bytearray, blob_digest: str, rank: int, step: int, group: int, members: list[int],
              row: int) -> str:
        key = (step, group)
        for old in [k for k in self._accumulating if k[0] < step - 1 or (k[0] > step and rank not in self._seen)]:
            del self._accumulating[old]  # (older steps: never completed; later ones: a timeline cut short)
        self._seen.add(rank)
        entry = self._accumulating.setdefault(key, {"parity": np.zeros(0, np.uint8), "members": {}, "of": set(members)})
        if rank in entry["members"]:
            return "ok"  # (sent again after a reconnect: already folded in)
        if self.scheme == "xor":
            entry["parity"] = xor_into(entry["parity"], blob)
        else:
            entry["parity"] = isal.update(entry["parity"], blob, len(members), self.parities, row, members.index(rank))
        entry["members"][rank] = (len(blob), blob_digest)
        if set(entry["members"]) >= entry["of"]:
            code = None if self.scheme == "xor" else {"k": len(members), "m": self.parities, "row": row,
                                                      "index": {r: i for i, r in enumerate(members)}}
            name = write_parity(self.parity_root, step, group, entry["parity"], entry["members"], code)
            self._parities_written.add((step, name))
            del self._accumulating[key]
            prune_parities(self.parity_root, step - 1)
        return "ok"

    # ----- the hand-over at a JIT event ---------------------------------------------------

    def hand_over(self, checkpoint_root: Path, saved_step: int | None) -> list[str]:
        """Copy into the shared ``peer_copies`` tier what another host's lost rank needs: ``replicate``: the
        predecessors' copies held here and this rank's own snapshots (but the minibatch its JIT save wrote);
        ``xor``, ``rs``: the parities kept here and every own snapshot (the others' rebuild reads them).  Returns
        what was copied (``step-N/rank-R``, ``step-N/group-G``)."""
        self._freeze()  # (no copy arriving now prunes or changes what is being handed over)
        target = peer_copies(checkpoint_root).root
        handed, failed = [], []
        ranks = (*sorted(self.keeps_for), self.rank) if self.scheme == "replicate" else (self.rank,)
        for rank in ranks:
            name = rank_dir_name(rank)
            current = [step for step in self.memory.list_steps() if (step_dir(self.memory.root, step) / name).is_dir()
                       and not (self.scheme == "replicate" and rank == self.rank and step == saved_step)
                       and (rank == self.rank or (rank, step) in self._received)]  # (not an earlier worker's)
            # What an earlier attempt handed over for this rank goes first: another timeline's, or stale.  What
            # another survivor handed over at this event (with copies > 1, it keeps the same rank's) stays.
            for step in (DiskStore(target).list_steps() if target.is_dir() else []):
                if step not in current and not self._handed_now(target, step, name):
                    shutil.rmtree(step_dir(target, step) / name, ignore_errors=True)
            for step in current:
                source = step_dir(self.memory.root, step) / name
                try:
                    make_private_dir(target, parents=True)
                    install_rank_copy(target, step, name, lambda partial: copy_private(source, partial),
                                      replace=not self._handed_now(target, step, name))
                    write_private_file(step_dir(target, step) / f".{name}.handed-over", self.generation.encode())
                    handed.append(f"{step_dir(target, step).name}/{name}")
                except (OSError, shutil.Error) as exc:
                    failed.append(f"{step_dir(target, step).name}/{name}: {exc}")
        shared = parity_area(checkpoint_root)
        mine = [(step, meta) for step, _, meta in parities(self.parity_root)
                if (step, meta.stem) in self._parities_written]  # (not an earlier worker's: another timeline's)
        # The parities an earlier attempt of this rank handed over go first (only this rank writes their names).
        names = {f"group-{group}" + (f".row-{row}" if self.scheme == "rs" else "") for group, (_, row) in self._holds.items()}
        for step in (DiskStore(shared).list_steps() if shared.is_dir() else []):
            for name in names:
                if (step, name) not in {(s, m.stem) for s, m in mine}:
                    for suffix in (".json", ".parity"):  # (the JSON first: without it the parity is incomplete)
                        (step_dir(shared, step) / f"{name}{suffix}").unlink(missing_ok=True)
        for step, meta in mine:
            there = step_dir(shared, step)
            try:
                make_private_dir(there, parents=True)
                for part in (meta.with_suffix(".parity"), meta):  # (the JSON last: it marks the parity complete)
                    hidden = there / f".{part.name}.partial-{os.getpid()}"
                    copy_private_file(part, hidden)
                    os.replace(hidden, there / part.name)
                handed.append(f"{there.name}/{meta.stem}")
            except OSError as exc:
                failed.append(f"{there.name}/{meta.stem}: {exc}")
        if failed:
            raise HandOverError(handed, failed)
        return handed

    def _handed_now(self, target: Path, step: int, name: str) -> bool:
        """Whether rank directory ``name`` of ``step`` under ``target`` was handed over in this attempt (by this
        rank or another survivor keeping the same rank's copies): its note names this attempt's generation."""
        try:
            return bool(self.generation) and (step_dir(target, step) / f".{name}.handed-over").read_text() == self.generation
        except (OSError, UnicodeDecodeError):
            return False

    def close(self) -> None:
        self._close()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # (wakes the accepting thread; close alone would not)
            except OSError:
                pass
            self._listener.close()


def _free_bytes(path: Path) -> int | None:
    """Bytes free on the file system of ``path`` (or of the nearest folder above it that exists)."""
    for folder in (path, *path.parents):
        try:
            fs = os.statvfs(folder)
        except OSError:
            continue
        return fs.f_bavail * fs.f_frsize
    return None


def _receive_into(conn: socket.socket, fd: int, size: int) -> None:
    """The next ``size`` bytes of ``conn`` written to ``fd``."""
    buf = bytearray(min(size, _CHUNK) or 1)
    view = memoryview(buf)
    left = size
    while left:
        n = conn.recv_into(view, min(left, len(buf)))
        if n == 0:
            raise ValueError(f"the stream ended {left} bytes short")
        written = 0
        while written < n:
            written += os.write(fd, view[written:n])
        left -= n


def _drain(conn: socket.socket, size: int) -> None:
    """Read and drop the next ``size`` bytes of ``conn``."""
    buf = bytearray(min(size, _CHUNK) or 1)
    while size:
        n = conn.recv_into(buf, min(size, len(buf)))
        if n == 0:
            raise ValueError(f"the stream ended {size} bytes short")
        size -= n


def _fill(conn: socket.socket, view: memoryview) -> None:
    """The next ``len(view)`` bytes of ``conn``, into ``view``."""
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:], min(len(view) - got, _CHUNK))
        if n == 0:
            raise ValueError(f"the stream ended after {got} of {len(view)} bytes")
        got += n


def _read_exact(conn: socket.socket, size: int, allow_eof: bool = False) -> bytes | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], min(size - got, _CHUNK))
        if n == 0:
            if allow_eof and got == 0:
                return None
            raise ValueError(f"the stream ended after {got} of {size} bytes")
        got += n
    return bytes(buf)


def _read_line(conn: socket.socket) -> str:
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection before answering")
        line += chunk
        if len(line) > 4096:
            raise ConnectionError("an answer too long")
    return line.decode(errors="replace").strip()


def _my_address() -> str:
    """The address the other hosts reach this one at: that of the interface towards the job's master."""
    master = os.environ.get("MASTER_ADDR", "")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master or "127.0.0.1", int(os.environ.get("MASTER_PORT", "29500"))))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()

