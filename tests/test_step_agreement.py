"""All ranks resume from the same step, agreed through the job's torchrun store (jitckpt.worker.step_agreement).

A rank whose listing of the checkpoint root is stale (a shared file system's
client cache that has not seen the newest step) used to resume at an older
minibatch than its peers, silently.  These tests give ranks different views
of one checkpoint root (a worker's ``DiskStore.list_steps`` leaves out steps,
as a stale directory cache would) and check what every rank loads.

- Unit level: three real worker processes with jitckpt armed, calling
  ``jitckpt.jit_get_checkpoint_path()``, and a real TCPStore on loopback,
  through each of the three ways a worker reaches the store: a client of the
  agent's store (hosted here, as torchrun's agent would), the store rank 0
  hosts before ``init_process_group`` (jit-run's default), and the default
  process group's (a real gloo group and DDP).
- End to end: a jit-run/torchrun job of examples/train_mlp.py whose rank 2
  cannot see the newest JIT checkpoint after the second restart; the job
  resumes every rank from the older one and still ends bit-for-bit like a
  fault-free run.
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pytest

from conftest import EXAMPLE, job_env, run_jit
from jitckpt import eventlog
from jitckpt.store import ParallelCoordinates
from jitckpt.store import disk

pytestmark = pytest.mark.slow

WORLD = 3
STEPS = (3, 6)  # complete checkpoints of every rank
NEWEST, OLDER = 6, 3
WORKER_TIMEOUT = 120  # seconds for a whole group of worker processes
DISAGREEMENT = "the ranks selected different checkpoints"

# A worker: arms jitckpt as jit-run's bootstrap does, optionally with a stale view of the
# checkpoint root, builds what a training script builds and asks where to resume from.
WORKER = textwrap.dedent(
    """
    import json, os, sys
    visible = os.environ.get("TEST_VISIBLE_STEPS")
    if visible is not None:  # this rank's listing of the checkpoint root is stale
        from jitckpt.store import disk
        listed = disk.DiskStore.list_steps
        disk.DiskStore.list_steps = lambda self: [s for s in listed(self) if str(s) in visible.split(",")]
    import torch
    import jitckpt
    import jitckpt.worker
    jitckpt.worker.arm()
    mode = os.environ.get("TEST_MODE", "plain")
    model = torch.nn.Linear(2, 2)
    try:
        if mode == "ddp_first":  # DDP built before the optimizer: the checkpoint is looked up twice
            torch.distributed.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        elif mode == "optimizer_first":  # ... and once
            torch.distributed.init_process_group("gloo")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        path = jitckpt.jit_get_checkpoint_path()
    except Exception as exc:
        print("RESULT " + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        sys.exit(3)
    if mode == "init_after":  # the process group after the agreement: it shares rank 0's store server
        torch.distributed.init_process_group("gloo")
    if torch.distributed.is_initialized():
        total = torch.ones(1)
        torch.distributed.all_reduce(total)
        assert total.item() == torch.distributed.get_world_size()
        torch.distributed.destroy_process_group()
    print("RESULT " + json.dumps({"path": path}), flush=True)
    """
)


@dataclass
class Worker:
    rank: int
    returncode: int
    stderr: str
    result: dict

    @property
    def step(self) -> int | None:
        path = self.result.get("path")
        return None if path is None else int(Path(path).parent.name.split("-")[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_store() -> Any:
    """A TCPStore hosted by the test, as torchrun's agent hosts it for its workers."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=30))


def checkpoint_root(tmp_path: Path, steps: tuple[int, ...] = STEPS) -> Path:
    """Complete checkpoints of every rank at ``steps``, as a data-parallel job's JIT saves leave them."""
    root = tmp_path / "ckpt"
    for step in steps:
        for rank in range(WORLD):
            pending = disk.PendingSave(root, step, ParallelCoordinates.from_layout(rank, WORLD))
            (pending.path / "state.pt").write_bytes(f"rank {rank} at minibatch {step}".encode())
            pending.commit({"reason": "test"})
    return root


def run_workers(tmp_path: Path, root: Path, port: int, *, agent_hosts_store: bool = True,
                ranks: Iterable[int] = range(WORLD),
                per_rank: dict[int, dict[str, str]] | None = None, extra: dict[str, str] | None = None) -> list[Worker]:
    """Start one worker process per rank in ``ranks`` (of a world of WORLD) and wait for all of them."""
    program = tmp_path / "worker.py"
    program.write_text(WORKER)
    procs = []
    for rank in ranks:
        env = job_env() | {
            "JITCKPT_ACTIVE": "1", "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": str(agent_hosts_store), "JITCKPT_CHECKPOINT_DIR": str(root),
            "JITCKPT_RUN_DIR": str(tmp_path / "run"), "OMP_NUM_THREADS": "1",
        }
        for name in ("JITCKPT_RENDEZVOUS_ROUND", "JITCKPT_WORKER_GENERATION", "TORCHELASTIC_RESTART_COUNT",
                     "JITCKPT_AGREEMENT_TIMEOUT", "JITCKPT_SHM_DIR", "TEST_VISIBLE_STEPS", "TEST_MODE"):
            env.pop(name, None)
        env |= (extra or {}) | (per_rank or {}).get(rank, {})
        procs.append((rank, subprocess.Popen([sys.executable, str(program)], env=env, cwd=tmp_path, text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    workers = []
    for rank, proc in procs:
        try:
            out, err = proc.communicate(timeout=WORKER_TIMEOUT)
        except subprocess.TimeoutExpired:
            for _, other in procs:
                other.kill()
            raise AssertionError(f"rank {rank}'s worker did not finish in {WORKER_TIMEOUT} s (a hang)") from None
        found = re.findall(r"^RESULT (.*)$", out, re.M)
        workers.append(Worker(rank, proc.returncode, err, json.loads(found[-1]) if found else {}))
    return workers


def agreement_events(tmp_path: Path) -> list[dict]:
    return [e for e in eventlog.read_all(tmp_path / "run") if e["event"] == "step_agreement"]


def describe(workers: list[Worker]) -> str:
    return "\n".join(f"--- rank {w.rank} (exit {w.returncode}) {w.result}\n{w.stderr[-2500:]}" for w in workers)


def test_a_rank_with_a_stale_listing_makes_every_rank_load_the_older_step(tmp_path):
    """Rank 2 does not see minibatch 6: every rank resumes from minibatch 3, and says why.

    Before init_process_group and with jit-run's default (the agent does not
    share its store), rank 0 hosts the store; the process group made
    afterwards reuses that server.
    """
    root = checkpoint_root(tmp_path)
    workers = run_workers(tmp_path, root, free_port(), agent_hosts_store=False,
                          per_rank={2: {"TEST_VISIBLE_STEPS": str(OLDER)}}, extra={"TEST_MODE": "init_after"})
    assert all(w.returncode == 0 for w in workers), describe(workers)
    assert [w.step for w in workers] == [OLDER] * WORLD, describe(workers)
    assert [Path(w.result["path"]).name for w in workers] == ["rank-00000", "rank-00001", "rank-00002"]
    for w in workers:
        (line,) = [line for line in w.stderr.splitlines() if DISAGREEMENT in line]
        assert line.startswith(f"[jitckpt rank {w.rank}] ") and (
            f"(minibatch {NEWEST} on rank 0,1; minibatch {OLDER} on rank 2): their listings of {root} differ"
            in line and f"every rank resumes from minibatch {OLDER}, the newest step all of them selected" in line), line
        assert line.endswith(f"(this rank had selected minibatch {NEWEST})") == (w.rank != 2), line
        assert f"resuming from minibatch {OLDER}" in w.stderr
    events = sorted(agreement_events(tmp_path), key=lambda e: e["rank"])
    assert [(e["rank"], e["selected"], e["agreed"], e["loaded"]) for e in events] == [
        (0, NEWEST, OLDER, True), (1, NEWEST, OLDER, True), (2, OLDER, OLDER, True)], events
    assert all(e["choices"] == [[NEWEST, "0,1"], [OLDER, "2"]] for e in events), events


def test_a_rank_that_found_nothing_means_a_fresh_start_for_all(tmp_path):
    """Rank 1's listing is empty: nobody resumes, and the others do not claim their checkpoints are incomplete."""
    root = checkpoint_root(tmp_path)
    store = agent_store()
    workers = run_workers(tmp_path, root, store.port, per_rank={1: {"TEST_VISIBLE_STEPS": ""}})
    assert all(w.returncode == 0 for w in workers), describe(workers)
    assert [w.result for w in workers] == [{"path": None}] * WORLD, describe(workers)
    for w in workers:
        (line,) = [line for line in w.stderr.splitlines() if DISAGREEMENT in line]
        assert "rank 1 found no checkpoint, so every rank starts afresh from minibatch 0" in line, line
        assert "covers every shard of this job" not in w.stderr, w.stderr
    assert sorted((e["rank"], e["agreed"]) for e in agreement_events(tmp_path)) == [(0, None), (1, None), (2, None)]


def test_a_second_look_stays_at_the_agreed_step_and_waits_for_nobody(tmp_path):
    """With a real gloo group and DDP: ranks 0 and 1 build DDP before the optimizer (they look twice,
    the second time knowing their shard identity), rank 2 the other way round (once).  The second
    look neither picks the newest step again nor waits for peers that never look again."""
    root = checkpoint_root(tmp_path)
    store = agent_store()
    workers = run_workers(tmp_path, root, store.port, per_rank={
        0: {"TEST_MODE": "ddp_first"}, 1: {"TEST_MODE": "ddp_first"},
        2: {"TEST_MODE": "optimizer_first", "TEST_VISIBLE_STEPS": str(OLDER)}})
    assert all(w.returncode == 0 for w in workers), describe(workers)
    assert [w.step for w in workers] == [OLDER] * WORLD, describe(workers)
    assert all(sum(DISAGREEMENT in line for line in w.stderr.splitlines()) == 1 for w in workers), describe(workers)


def test_a_rank_that_cannot_load_the_agreed_step_stops_every_rank_with_the_cause(tmp_path):
    """Rank 2 sees only minibatch 3, rank 0 only minibatch 6: rank 0 cannot load the agreed step."""
    root = checkpoint_root(tmp_path)
    store = agent_store()
    workers = run_workers(tmp_path, root, store.port, per_rank={
        0: {"TEST_VISIBLE_STEPS": str(NEWEST)}, 2: {"TEST_VISIBLE_STEPS": str(OLDER)}})
    assert all(w.returncode == 3 for w in workers), describe(workers)
    cause = (f"CheckpointError: rank 0 cannot load the agreed checkpoint of minibatch {OLDER} (the newest step every "
             f"rank selected): minibatch {OLDER} is not in this rank's listing of {root}")
    assert workers[0].result["error"] == cause, describe(workers)
    for w in workers[1:]:
        assert w.result["error"] == f"{cause}; rank {w.rank} stops too, before loading anything", describe(workers)
        assert "resuming from" not in w.stderr
    events = sorted(agreement_events(tmp_path), key=lambda e: e["rank"])
    assert [(e["rank"], e["agreed"], e["loaded"]) for e in events] == [(0, OLDER, False), (1, OLDER, True),
                                                                       (2, OLDER, True)], events


@pytest.mark.serial  # the ranks that do start must all publish within the 2 s: alone, not beside other jobs
@pytest.mark.parametrize("absent", [2, 0], ids=["a-follower", "rank-0-the-leader"])
def test_a_peer_that_never_publishes_is_named_after_the_timeout(tmp_path, absent):
    """One rank never starts: the others stop after JITCKPT_AGREEMENT_TIMEOUT with an error naming it."""
    root = checkpoint_root(tmp_path)
    store = agent_store()
    workers = run_workers(tmp_path, root, store.port, ranks=[r for r in range(WORLD) if r != absent],
                          extra={"JITCKPT_AGREEMENT_TIMEOUT": "2"})
    for w in workers:
        assert w.returncode == 3, describe(workers)
        assert w.result["error"] == (
            f"CheckpointError: rank {w.rank} stops: rank {absent} did not publish its checkpoint choice within 2 s "
            f"(JITCKPT_AGREEMENT_TIMEOUT): it crashed or is stuck before selecting a checkpoint, or never calls "
            f"jit_get_checkpoint_path() (every rank must); nothing was loaded"), describe(workers)


def test_ranks_that_agree_change_nothing_and_a_restart_never_reads_the_old_attempts_keys(tmp_path):
    """Every rank sees every step: all load minibatch 6, nothing is said.  The agent's store still holds
    the keys of rendezvous round 0 (in which rank 2 chose minibatch 3); round 1 does not read them."""
    root = checkpoint_root(tmp_path)
    store = agent_store()
    old = "jitckpt/step-agreement/round-0"
    store.set(f"{old}/choice/2", json.dumps({"step": OLDER, "error": None}))
    store.set(f"{old}/choice/1", json.dumps({"step": None, "error": "CheckpointError: the dead attempt's"}))
    workers = run_workers(tmp_path, root, store.port, extra={"JITCKPT_RENDEZVOUS_ROUND": "1"})
    assert all(w.returncode == 0 for w in workers), describe(workers)
    assert [w.step for w in workers] == [NEWEST] * WORLD, describe(workers)
    assert not any(DISAGREEMENT in w.stderr for w in workers), describe(workers)
    assert agreement_events(tmp_path) == []
    keys = [f"jitckpt/step-agreement/round-1/choice/{rank}" for rank in range(WORLD)]
    assert store.check(keys), "the ranks did not publish their choices in the store"
    published = [json.loads(store.get(key)) for key in keys]
    assert published == [{"step": NEWEST, "error": None, "why": None}] * WORLD


def test_end_to_end_a_stale_view_after_a_restart_resumes_every_rank_from_the_same_step(tmp_path, fault_free_sha):
    """jit-run, 3 ranks: rank 1 is killed at minibatch 3 (attempt 0) and at minibatch 6 (attempt 1).
    In attempt 2, rank 2's listing lacks minibatch 6: every rank resumes from minibatch 3, bit-exact."""
    program = tmp_path / "train_with_stale_view.py"
    program.write_text(textwrap.dedent(
        f"""
        import os, runpy, sys
        sys.path.insert(0, {str(EXAMPLE.parent)!r})
        if os.environ["RANK"] == "2" and os.environ.get("JITCKPT_WORKER_GENERATION") == "2":
            from jitckpt.store import disk
            listed = disk.DiskStore.list_steps
            disk.DiskStore.list_steps = lambda self: [s for s in listed(self) if s <= {OLDER}]
        sys.argv[0] = {str(EXAMPLE)!r}
        runpy.run_path({str(EXAMPLE)!r}, run_name="__main__")
        """))
    faults = f"rank=1,step={OLDER},phase=forward,kind=kill;rank=1,step={NEWEST},phase=forward,kind=kill,attempt=1"
    result = run_jit(tmp_path / "ckpt", fault=faults, script=program, args=["--steps", "24", "--accum", "2",
                                                                             "--log-every", "1000"])
    assert result.returncode == 0, result.output[-4000:]
    resumed = re.findall(r"^\[jitckpt rank (\d)\] resuming from minibatch (\d+)", result.output, re.M)
    assert sorted(resumed) == sorted([(str(r), str(OLDER)) for r in range(3)] * 2), resumed
    said = [line for line in result.output.splitlines() if DISAGREEMENT in line]
    assert len(said) == 3 and all(f"minibatch {NEWEST} on rank 0,1; minibatch {OLDER} on rank 2" in line
                                  for line in said), said
    assert (tmp_path / "ckpt" / f"step-{NEWEST:08d}").is_dir()
    assert [f["resumed_from_minibatch"] for f in result.report["failures"]] == [OLDER, OLDER], result.report
    assert result.sha == fault_free_sha, "parameters differ from the fault-free run\n" + result.output[-4000:]
