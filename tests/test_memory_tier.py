"""The memory tier (jitckpt.worker.memory_snapshots, jitckpt.store.memory): a sharded job that loses a rank resumes from host-memory snapshots.

Real torchrun jobs over gloo, from the user's side
(tests/sharded_programs/train_sharded.py): the faults are the script's own
(``--die RANK:STEP:WHERE:HOW``: a forward pre-hook, a gradient hook, a wrapper
around the reduce-scatter or ZeRO's broadcast, an optimizer post-hook), never
jitckpt's hooks, but for the one fault inside jitckpt's own snapshot.  Each
job must end with parameters bit-for-bit equal to a fault-free run without
jit-run, resume at the minibatch the lost rank was in, and take the lost
rank's shard from memory.

Before the memory tier every one of these jobs started afresh from minibatch 0
("no surviving copy of the shard of rank 1 ..."), and a frozen FSDP2 rank
ended the job with no result; tests/test_sharded.py keeps that fallback
covered with ``--memory-tier off``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import REPO, reference_sha, run_jit
from jitckpt.store.memory import MemoryStore, memory_root
from jitckpt.worker.memory_snapshots import MemorySnapshots
from jitckpt.store import CheckpointError, DiskStore, ParallelCoordinates, select
from jitckpt.store.shard import Sharding
from jitckpt.store.tiered import TieredStore

PROGRAM = REPO / "tests" / "sharded_programs" / "train_sharded.py"
STEPS = 10
RESUMING = re.compile(r"^\[jitckpt rank (\d+)\] resuming from minibatch (\d+): (\S+)( \(a snapshot in host memory)?",
                      re.M)


def fault_free(mode: str, nproc: int) -> str:
    """Final-parameter hash of the job under plain torchrun (no jit-run), computed once per test run."""
    return reference_sha(nproc, ["--mode", mode, "--steps", str(STEPS)], PROGRAM)


def run(tmp_path: Path, mode: str, nproc: int, *args: str, jit_options: list[str] | None = None):
    return run_jit(tmp_path / "ckpt", nproc=nproc, script=PROGRAM, jit_options=jit_options,
                   args=["--mode", mode, "--steps", str(STEPS), *args])


def resumes(output: str) -> dict[int, tuple[int, bool]]:
    """rank -> (minibatch resumed from, whether from the memory tier), for the last resume of each rank."""
    return {int(rank): (int(step), bool(memory)) for rank, step, _, memory in RESUMING.findall(output)}


def check_bit_exact(result, expected: str) -> None:
    assert result.returncode == 0, result.output[-5000:]
    assert result.sha == expected, "parameters differ from the fault-free run\n" + result.output[-5000:]


@pytest.mark.slow
@pytest.mark.parametrize("fault, resumed_at, redone", [
    (["--die", "1:5:forward:kill"], 5, 1),   # inside the forward: its snapshot of minibatch 5 was taken before it
    (["--die", "2:5:backward:hang"], 5, 1),  # frozen in backward: the peers save 5, rank 2's shard comes from memory
    (["--die", "1:5:step:kill"], 5, 2),      # inside optimizer.step(): the peers finish 5 and save 6, rank 1 never did
    (["--fault", "1:5:KILL"], 4, 2),         # between two minibatches, before its snapshot of 5: the one of 4
], ids=["kill-in-forward", "hang-in-backward", "kill-in-optimizer-step", "kill-between-minibatches"])
def test_fsdp_rank_lost_resumes_from_memory_bit_exact(tmp_path, fault, resumed_at, redone):
    expected = fault_free("fsdp", 3)
    result = run(tmp_path, "fsdp", 3, *fault)
    check_bit_exact(result, expected)
    die = fault[1]
    lost = int(die.split(":")[0])
    done = resumes(result.output)
    assert sorted(done) == [0, 1, 2] and {step for step, _ in done.values()} == {resumed_at}, done
    assert done[lost][1], f"rank {lost}'s shard did not come from the memory tier: {done}"
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == resumed_at and not failure["restarted_fresh"], failure
    assert lost in failure["memory_tier_ranks"], failure
    # minibatches redone, as the report counts them: from the resumed one to the furthest one a rank was in.
    # Killed inside its optimizer step, the lost rank never finished minibatch 5 while its peers went on
    # into 6: 5 is the one completed minibatch redone, 6 was in progress.  Killed before its first forward
    # of 5, its newest snapshot is of 4: 4 is redone, 5 was in progress.
    assert failure["minibatches_redone"] == redone, failure
    lost_lines = [line for line in result.output.splitlines() if "no surviving copy" in line]
    if redone == 2:  # the peers' JIT saves of the minibatch they were in lack rank 1's shard: said, passed over
        saved = f"step-{resumed_at + 1:08d}"
        assert lost_lines and all(saved in line and "shard of rank 1 " in line for line in lost_lines), lost_lines
    else:
        assert not lost_lines, lost_lines


def _wait_for_copy(log: Path, rank: int, step: int, timeout: float = 60) -> None:
    """Until the host that wrote ``log`` keeps in memory the copy of ``rank``'s snapshot of ``step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"snapshotted into host memory \((\S+)\)", log.read_text(errors="replace"))
        if found and (Path(found.group(1)) / f"step-{step:08d}" / f"rank-{rank:05d}").is_dir():
            return
        time.sleep(0.05)
    raise AssertionError(f"no copy of rank {rank}'s snapshot of minibatch {step} arrived\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_fsdp_lost_host_resumes_from_the_copies_in_the_other_hosts_memory_bit_exact(tmp_path):
    """Two jit-run "hosts" of two ranks each: rank 2 freezes in its backward of minibatch 5 and then its whole host
    is lost (every process killed, its shared memory never seen again).  The surviving host's ranks save 5 and
    hand over the copies of ranks 2 and 3 they keep in memory; the replacement host's ranks resume from them,
    with their own random state, and the job ends bit-exact without --allow-inexact-resume."""
    from test_multinode import _finish, _free_port, _launch_node, _lose_node, _wait_listening

    expected = fault_free("fsdp", 4)
    base = ["--mode", "fsdp", "--steps", str(STEPS)]
    port = _free_port()
    survivor = _launch_node(tmp_path, "survivor", port, script=PROGRAM, script_args=base)
    _wait_listening(port)
    lost = _launch_node(tmp_path, "lost", port, script=PROGRAM, script_args=[*base, "--die", "2:5:backward:hang"])
    deadline = time.monotonic() + 240
    while "rank 2: hang myself in the backward of minibatch 5" not in (tmp_path / "lost.log").read_text(errors="replace"):
        assert time.monotonic() < deadline and lost.poll() is None, (tmp_path / "lost.log").read_text()[-3000:]
        time.sleep(0.1)
    _wait_for_copy(tmp_path / "survivor.log", rank=2, step=5)  # (the copies travel beside the training)
    _lose_node(lost.pid)
    lost.wait()
    replacement = _launch_node(tmp_path, "replacement", port, script=PROGRAM, script_args=base)
    results = {name: _finish(tmp_path, name, proc) for name, proc in (("survivor", survivor),
                                                                     ("replacement", replacement))}
    outputs = "\n".join(output for _, output, _ in results.values())
    for code, output, report in results.values():
        assert code == 0 and report is not None, output[-4000:]
    assert f"final parameters sha256 {expected}" in outputs, outputs[-6000:]
    done = resumes(outputs)
    assert done == {0: (5, False), 1: (5, False), 2: (5, True), 3: (5, True)}, done
    assert "handed over step-00000005/rank-00002" in outputs and "handed over step-00000005/rank-00003" in outputs
    assert "no RNG state" not in outputs and "not bit-exact" not in outputs, outputs[-4000:]
    (failure,) = results["survivor"][2]["failures"]
    assert failure["resumed_from_minibatch"] == 5 and failure["minibatches_redone"] == 1, failure


# Where a healthy host is lost with a frozen one: a hang timeout far longer than the test takes to lose both, so
# that the healthy host's rank never detects the freeze and saves first (host 0's rank learns of the loss from
# its broken connections at once).
LOST_BEFORE_DETECTED = ["--hang-timeout", "60"]


def _three_hosts(tmp_path: Path, port: int, base: list[str], **launch) -> dict:
    """Three jit-run "hosts" of one FSDP2 rank each; hosts 1 and 2 carry the fault "rank 1 freezes in its backward
    of minibatch 5" (which of them gets rank 1 is the rendezvous's choice)."""
    from test_multinode import _launch_node, _wait_listening

    hosts = {"host0": _launch_node(tmp_path, "host0", port, script=PROGRAM, script_args=base, nproc_per_node=1,
                                   nnodes=3, **launch)}
    _wait_listening(port)
    for name in ("host1", "host2"):
        hosts[name] = _launch_node(tmp_path, name, port, script=PROGRAM, nproc_per_node=1, nnodes=3,
                                   script_args=[*base, "--die", "1:5:backward:hang"], **launch)
    return hosts


@pytest.mark.slow
def test_xor_lost_host_is_rebuilt_from_the_parity_on_a_third_host_bit_exact(tmp_path):
    """``--memory-redundancy xor``, three hosts of one FSDP2 rank each: ranks 0 and 1 form a group whose XOR
    parity the third host keeps (no copies).  Rank 1 freezes in its backward of minibatch 5 and its host is
    lost; its snapshot is rebuilt from rank 0's and the parity, and the job ends bit-exact, one minibatch redone."""
    from test_multinode import _finish, _free_port, _launch_node, _lose_node

    expected = fault_free("fsdp", 3)
    base = ["--mode", "fsdp", "--steps", str(STEPS)]
    xor = ["--memory-redundancy", "xor"]
    port = _free_port()
    hosts = _three_hosts(tmp_path, port, base, jit_options=xor)
    deadline = time.monotonic() + 240
    hung = None
    while hung is None:
        hung = next((name for name in ("host1", "host2") if "rank 1: hang myself in the backward of minibatch 5"
                     in (tmp_path / f"{name}.log").read_text(errors="replace")), None)
        assert time.monotonic() < deadline and hosts["host1"].poll() is None, (tmp_path / "host1.log").read_text()[-3000:]
        time.sleep(0.1)
    memories = [Path("/dev/shm") / f"jitckpt-{run.name[len('run-'):]}" for run in (tmp_path / "ckpt" / ".jitckpt").glob("run-*")]
    while not any((m / "parity" / "step-00000005" / "group-0.json").is_file() for m in memories):
        assert time.monotonic() < deadline, memories
        time.sleep(0.05)
    _lose_node(hosts[hung].pid)
    hosts[hung].wait()
    hosts["replacement"] = _launch_node(tmp_path, "replacement", port, script=PROGRAM, script_args=base,
                                        nproc_per_node=1, nnodes=3, jit_options=xor)
    other = "host2" if hung == "host1" else "host1"
    results = {name: _finish(tmp_path, name, hosts[name]) for name in ("host0", other, "replacement")}
    outputs = "\n".join(output for _, output, _ in results.values())
    for code, output, report in results.values():
        assert code == 0 and report is not None, output[-4000:]
    assert f"final parameters sha256 {expected}" in outputs, outputs[-6000:]
    assert "rebuilt step-00000005/rank-00001" in outputs and "from XOR parity" in outputs, outputs[-4000:]
    hidden = tmp_path / "ckpt" / ".jitckpt"  # the job completed: what was handed over is gone
    assert not (hidden / "from-peer-memory").exists() and not (hidden / "from-peer-memory-parity").exists()
    assert resumes(outputs) == {0: (5, False), 1: (5, True), 2: (5, False)}, resumes(outputs)
    assert "no RNG state" not in outputs and "not bit-exact" not in outputs, outputs[-4000:]
    (failure,) = results["host0"][2]["failures"]
    assert failure["resumed_from_minibatch"] == 5 and failure["minibatches_redone"] == 1, failure


@pytest.mark.slow
@pytest.mark.parametrize("where", [("backward", "backward"), ("collective", "collective")],
                         ids=["both-in-backward", "both-in-reduce-scatter"])
def test_rs_two_hosts_lost_together_are_rebuilt_from_two_parities_bit_exact(tmp_path, where):
    """``--memory-redundancy rs`` (2 data + 2 parities), four hosts of one FSDP2 rank each: ranks 2 and 3 form a
    group whose two Reed-Solomon parities ranks 0 and 1 keep.  Both freeze in minibatch 5 (in the backward, or
    in FSDP2's gradient reduce-scatter: two frozen ranks stop in the same phase, the first holds the other's
    collectives) and both their hosts are lost at once;
    their snapshots are rebuilt from the two parities alone, and the job ends bit-exact, one minibatch redone."""
    from test_multinode import _finish, _free_port, _launch_node, _lose_node, _wait_listening

    expected = fault_free("fsdp", 4)
    base = ["--mode", "fsdp", "--steps", str(STEPS)]
    rs = ["--memory-redundancy", "rs"]
    dies = ["--die", f"2:5:{where[0]}:hang", "--die", f"3:5:{where[1]}:hang"]
    port = _free_port()
    hosts = {"host0": _launch_node(tmp_path, "host0", port, script=PROGRAM, script_args=base, nproc_per_node=1,
                                   nnodes=4, jit_options=rs)}
    _wait_listening(port)
    candidates = ("host1", "host2", "host3")  # (which of them get ranks 2 and 3 is the rendezvous's choice)
    for name in candidates:
        hosts[name] = _launch_node(tmp_path, name, port, script=PROGRAM, nproc_per_node=1, nnodes=4, jit_options=rs,
                                   script_args=[*base, *dies])
    deadline = time.monotonic() + 300
    hung: dict[int, str] = {}
    while len(hung) < 2:
        for name in candidates:
            for rank, at in zip((2, 3), where):
                if f"rank {rank}: hang myself in the {at} of minibatch 5" in (tmp_path / f"{name}.log").read_text(errors="replace"):
                    hung[rank] = name
        assert time.monotonic() < deadline and all(hosts[n].poll() is None for n in candidates), \
            "\n".join((tmp_path / f"{n}.log").read_text()[-2000:] for n in candidates)
        time.sleep(0.1)
    memories = [Path("/dev/shm") / f"jitckpt-{run.name[len('run-'):]}" for run in (tmp_path / "ckpt" / ".jitckpt").glob("run-*")]
    for row in (0, 1):  # (each parity complete: both members' copies folded in)
        while not any((m / "parity" / "step-00000005" / f"group-1.row-{row}.json").is_file() for m in memories):
            assert time.monotonic() < deadline, memories
            time.sleep(0.05)
    for name in hung.values():
        _lose_node(hosts[name].pid)
    for name in hung.values():
        hosts[name].wait()
    for n in (1, 2):
        hosts[f"replacement{n}"] = _launch_node(tmp_path, f"replacement{n}", port, script=PROGRAM, script_args=base,
                                                nproc_per_node=1, nnodes=4, jit_options=rs)
    alive = ["host0", *(n for n in candidates if n not in hung.values()), "replacement1", "replacement2"]
    results = {name: _finish(tmp_path, name, hosts[name]) for name in alive}
    outputs = "\n".join(output for _, output, _ in results.values())
    for code, output, report in results.values():
        assert code == 0 and report is not None, output[-4000:]
    assert f"final parameters sha256 {expected}" in outputs, outputs[-6000:]
    for rank in (2, 3):
        assert f"step-00000005/rank-0000{rank} from Reed-Solomon parities" in outputs, outputs[-4000:]
    assert "any 2 lost hosts are rebuilt" in outputs, outputs[-4000:]
    assert resumes(outputs) == {0: (5, False), 1: (5, False), 2: (5, True), 3: (5, True)}, resumes(outputs)
    assert "no RNG state" not in outputs and "not bit-exact" not in outputs, outputs[-4000:]
    hidden = tmp_path / "ckpt" / ".jitckpt"  # the job completed: what was handed over is gone
    assert not (hidden / "from-peer-memory").exists() and not (hidden / "from-peer-memory-parity").exists()
    (failure,) = results["host0"][2]["failures"]
    assert failure["resumed_from_minibatch"] == 5 and failure["minibatches_redone"] == 1, failure


@pytest.mark.slow
def test_two_neighbouring_hosts_lost_name_the_shard_with_no_copy_left_and_fall_back(tmp_path):
    """Three hosts of one FSDP2 rank each: hosts 1 and 2 are lost together.  Rank 1's copy was kept by rank 2,
    lost with it: beyond what one copy tolerates.  The selection names that shard, uses no partial step, and
    the job starts afresh and still ends bit-exact (correct, only later)."""
    from test_multinode import _finish, _free_port, _launch_node, _lose_node

    expected = fault_free("fsdp", 3)
    base = ["--mode", "fsdp", "--steps", str(STEPS)]
    port = _free_port()
    hosts = _three_hosts(tmp_path, port, base, jit_options=LOST_BEFORE_DETECTED)
    deadline = time.monotonic() + 240
    logs = [tmp_path / "host1.log", tmp_path / "host2.log"]
    while not any("rank 1: hang myself in the backward of minibatch 5" in log.read_text(errors="replace") for log in logs):
        assert time.monotonic() < deadline and hosts["host1"].poll() is None, logs[0].read_text()[-3000:]
        time.sleep(0.1)
    _wait_for_copy(tmp_path / "host0.log", rank=2, step=5)
    for name in ("host1", "host2"):
        _lose_node(hosts[name].pid)
    for name in ("host1", "host2"):
        hosts[name].wait()
        hosts[f"new-{name}"] = _launch_node(tmp_path, f"new-{name}", port, script=PROGRAM, script_args=base,
                                            nproc_per_node=1, nnodes=3, jit_options=LOST_BEFORE_DETECTED)
    results = {name: _finish(tmp_path, name, hosts[name]) for name in ("host0", "new-host1", "new-host2")}
    outputs = "\n".join(output for _, output, _ in results.values())
    for code, output, report in results.values():
        assert code == 0, output[-4000:]
    assert f"final parameters sha256 {expected}" in outputs, outputs[-6000:]
    assert "handed over step-00000005/rank-00002" in outputs, outputs[-4000:]  # rank 2's copy survived on rank 0
    gone = [line for line in outputs.splitlines() if "no surviving copy of" in line and "step-00000005" in line]
    assert gone and all("shard of rank 1 " in line and "rank 2" not in line.split("no surviving copy of")[1]
                        for line in gone), gone
    assert "covers every shard of this job" in outputs, outputs[-4000:]
    assert resumes(outputs) == {}, resumes(outputs)  # nobody resumed: a fresh start from minibatch 0


@pytest.mark.slow
def test_two_copies_survive_two_neighbouring_hosts_lost_bit_exact(tmp_path):
    """The same two neighbouring hosts lost as above, with ``JITCKPT_MEMORY_COPIES=2``: every snapshot has a copy
    on each of the next two hosts, so host 0 keeps copies of ranks 1 and 2 both, hands them over, and the
    replacement hosts resume at minibatch 5 from them, bit-exact, one minibatch redone."""
    from test_multinode import _finish, _free_port, _launch_node, _lose_node

    expected = fault_free("fsdp", 3)
    base = ["--mode", "fsdp", "--steps", str(STEPS)]
    two = {"JITCKPT_MEMORY_COPIES": "2"}
    port = _free_port()
    hosts = _three_hosts(tmp_path, port, base, env=two, jit_options=LOST_BEFORE_DETECTED)
    deadline = time.monotonic() + 240
    logs = [tmp_path / "host1.log", tmp_path / "host2.log"]
    while not any("rank 1: hang myself in the backward of minibatch 5" in log.read_text(errors="replace") for log in logs):
        assert time.monotonic() < deadline and hosts["host1"].poll() is None, logs[0].read_text()[-3000:]
        time.sleep(0.1)
    for rank in (1, 2):
        _wait_for_copy(tmp_path / "host0.log", rank=rank, step=5)
    for name in ("host1", "host2"):
        _lose_node(hosts[name].pid)
    for name in ("host1", "host2"):
        hosts[name].wait()
        hosts[f"new-{name}"] = _launch_node(tmp_path, f"new-{name}", port, script=PROGRAM, script_args=base,
                                            nproc_per_node=1, nnodes=3, env=two, jit_options=LOST_BEFORE_DETECTED)
    results = {name: _finish(tmp_path, name, hosts[name]) for name in ("host0", "new-host1", "new-host2")}
    outputs = "\n".join(output for _, output, _ in results.values())
    for code, output, report in results.values():
        assert code == 0 and report is not None, output[-4000:]
    assert f"final parameters sha256 {expected}" in outputs, outputs[-6000:]
    assert "each with 2 copies on ranks of the next hosts" in outputs, outputs[-4000:]
    assert "handed over step-00000005/rank-00001" in outputs and "step-00000005/rank-00002" in outputs, outputs[-4000:]
    assert resumes(outputs) == {0: (5, False), 1: (5, True), 2: (5, True)}, resumes(outputs)
    assert "no RNG state" not in outputs and "not bit-exact" not in outputs, outputs[-4000:]
    (failure,) = results["host0"][2]["failures"]
    assert failure["resumed_from_minibatch"] == 5 and failure["minibatches_redone"] == 1, failure


@pytest.mark.slow
def test_zero_rank_killed_inside_the_step_resumes_from_memory_bit_exact(tmp_path):
    """ZeroRedundancyOptimizer: killed in the parameter broadcast after its local step; its peers, mid-step
    themselves, cannot save at all (their state is half-applied), so every shard comes from memory."""
    expected = fault_free("zero", 3)
    result = run(tmp_path, "zero", 3, "--die", "2:5:collective:kill")
    check_bit_exact(result, expected)
    done = resumes(result.output)
    assert done == {0: (5, True), 1: (5, True), 2: (5, True)}, done
    (failure,) = result.report["failures"]
    assert failure["saves"] == [] and failure["memory_tier_ranks"] == [0, 1, 2], failure
    assert failure["minibatches_redone"] == 1, failure


@pytest.mark.slow
def test_a_job_out_of_restarts_keeps_the_lost_shard_on_disk_and_a_rerun_resumes_from_it(tmp_path):
    """--max-restarts 0: the job ends failed, and its memory tier with it; jit-run first copies rank 1's snapshot
    beside the peers' JIT checkpoints, so that rerunning the same command resumes at minibatch 5, bit-exact."""
    expected = fault_free("fsdp", 3)
    args = ["--mode", "fsdp", "--steps", str(STEPS)]
    failed = run_jit(tmp_path / "ckpt", nproc=3, max_restarts=0, script=PROGRAM, args=[*args, "--die", "1:5:backward:kill"])
    assert failed.returncode != 0, failed.output[-3000:]
    assert (f"kept the memory tier's snapshots of minibatch 5 (rank-00001) in {tmp_path / 'ckpt'}: with the JIT "
            f"checkpoints there they cover every shard") in failed.output, failed.output[-3000:]
    rerun = run_jit(tmp_path / "ckpt", nproc=3, max_restarts=0, script=PROGRAM, args=args)
    check_bit_exact(rerun, expected)
    assert resumes(rerun.output) == {0: (5, False), 1: (5, False), 2: (5, False)}, rerun.output[-3000:]


@pytest.mark.slow
def test_a_corrupted_snapshot_is_detected_and_the_previous_one_used(tmp_path):
    """Rank 1 flips a byte of its newest snapshot, then dies in the reduce-scatter: its copy of minibatch 5
    fails its checksum, so every rank resumes from the previous snapshot (minibatch 4), bit-exact."""
    expected = fault_free("fsdp", 3)
    result = run(tmp_path, "fsdp", 3, "--die", "1:5:collective:kill", "--corrupt-own-snapshot")
    check_bit_exact(result, expected)
    assert re.search(r"^\[jitckpt rank 1\] warning: skipping checkpoint: \S+/memory/step-00000005/rank-00001: "
                     r"file state.pt fails its \S+ checksum \(corrupt\)$", result.output, re.M), result.output[-4000:]
    assert resumes(result.output) == {0: (4, True), 1: (4, True), 2: (4, True)}, result.output[-4000:]


@pytest.mark.slow
def test_a_rank_killed_during_its_own_snapshot_keeps_the_previous_one(tmp_path):
    """Killed while its snapshot of minibatch 5 is being written (jitckpt's own fault point, the only place
    such a fault can be put): the half-written one is never used, the one of minibatch 4 is."""
    expected = fault_free("fsdp", 3)
    result = run(tmp_path, "fsdp", 3, jit_options=["--fault", "rank=0,step=5,phase=snapshot,kind=kill"])
    check_bit_exact(result, expected)
    assert "injecting fault rank=0,step=5,phase=snapshot,kind=kill" in result.output, result.output[-4000:]
    done = resumes(result.output)
    assert {step for step, _ in done.values()} == {4} and done[0][1], done


@pytest.mark.slow
def test_hsdp_losing_both_copies_of_a_shard_needs_the_tier_on(tmp_path):
    """HSDP (2 x 2): ranks 1 and 3 hold the same shard, so the default (auto) takes no snapshots (a JIT save
    of the other replica covers one loss: tests/test_sharded.py).  With --memory-tier on, both frozen in
    backward at once still resume bit-exact, their shard from memory."""
    expected = fault_free("hsdp", 4)
    result = run(tmp_path, "hsdp", 4, "--die", "1:5:backward:hang", "--die", "3:5:backward:hang",
                 jit_options=["--memory-tier", "on"])
    check_bit_exact(result, expected)
    done = resumes(result.output)
    assert {step for step, _ in done.values()} == {5} and done[1][1] and done[3][1], done
    meta = json.loads(next((tmp_path / "ckpt").glob("step-00000005/rank-00000/jitckpt-meta.json")).read_text())
    assert meta["replicas"] == "0,2", meta  # the healthy ranks' JIT saves are on disk as before


# ----- the pieces, without a job ---------------------------------------------------------------------


def _commit(store, step: int, coords: ParallelCoordinates, payload: bytes = b"state") -> Path:
    pending = store.begin_save(step, coords)
    (pending.path / "state.pt").write_bytes(payload)
    return pending.commit({"saved_state": f"start of minibatch {step}"})


def _fsdp(rank: int, world: int = 3) -> ParallelCoordinates:
    shard = Sharding("parameters (FSDP2/DTensor)", (world,), tuple(range(world)), (0,))
    return ParallelCoordinates.from_layout(rank, world).with_sharding([shard])


def test_unreplicated_ranks_follow_the_layout():
    assert _fsdp(0).unreplicated_ranks() == [0, 1, 2]
    assert ParallelCoordinates.from_layout(1, 4).with_sharding([]).unreplicated_ranks() == []  # DDP: replicas
    hsdp = Sharding("parameters (FSDP2/DTensor)", (2, 2), (0, 1, 2, 3), (1,))
    assert ParallelCoordinates.from_layout(0, 4).with_sharding([hsdp]).unreplicated_ranks() == []
    assert ParallelCoordinates.from_layout(2, 3).with_sharding([], known=False).unreplicated_ranks() == [2]


def test_a_step_is_complete_across_tiers_and_a_rank_takes_its_own_copy(tmp_path):
    disk, memory = DiskStore(tmp_path / "disk"), MemoryStore(tmp_path / "shm")
    store = TieredStore(disk, memory)
    for rank in (0, 2):  # the healthy ranks' JIT saves of minibatch 5
        _commit(disk, 5, _fsdp(rank))
    assert select(DiskStore(tmp_path / "disk"), _fsdp(1)) is None  # rank 1's shard: nowhere on disk
    lost = _commit(memory, 5, _fsdp(1), b"rank 1's shard")
    assert store.list_steps() == [5]
    info = select(store, _fsdp(1))
    assert info is not None and info.path == lost and memory.holds(info.path)
    assert (info.path / "state.pt").read_bytes() == b"rank 1's shard"
    assert not memory.holds(select(store, _fsdp(0)).path)  # the JIT save first, where there is one
    (lost / "state.pt").write_bytes(b"rank 1's shaRd")  # corrupt: never loaded
    with pytest.raises(CheckpointError, match="fails its .* checksum"):
        store.verify(lost)
    assert select(store, _fsdp(1)) is None


class _Runtime:
    """What MemorySnapshots.take needs of the worker runtime."""

    def __init__(self, rank: int, shm: Path) -> None:
        from jitckpt import faults

        self.rank, self.step, self.attempt, self.shm_dir, self.hang_timeout = rank, 0, 0, shm, 3.0
        self.coords = _fsdp(rank)
        self.injector = faults.FaultInjector([], rank, 0)
        self.saved: list[int] = []

    def save_fn(self, path: str) -> None:
        Path(path, "state.pt").write_bytes(f"minibatch {self.step}".encode())
        self.saved.append(self.step)

    def jit_event_started(self) -> bool:
        return False

    def earlier_minibatches_settled(self, deadline: float, poll: float = 0.005) -> str | None:
        return None

    def mean_minibatch_seconds(self) -> float | None:
        return None


def test_two_snapshots_per_rank_alternate(tmp_path, monkeypatch):
    from jitckpt.worker import sharding

    monkeypatch.setattr(sharding, "refresh", lambda rt: rt.coords)
    monkeypatch.setattr(sharding, "optimizers", lambda: [object()])
    shm = tmp_path / "shm"
    shm.mkdir()
    tiers = [MemorySnapshots(shm, rank, "on") for rank in (0, 1)]
    runtimes = [_Runtime(rank, shm) for rank in (0, 1)]
    for step in range(4):
        for tier, rt in zip(tiers, runtimes):
            rt.step = step
            assert tier.take(rt) is not None
    store = DiskStore(memory_root(shm))
    assert store.list_steps() == [3, 2]  # the current minibatch's and the previous one's
    assert sorted(p.name for p in (memory_root(shm) / "step-00000002").iterdir()) == ["rank-00000", "rank-00001"]
    # a restart at minibatch 2 (the other snapshots' timeline was cut short): the first snapshot drops 3
    again = MemorySnapshots(shm, 0, "on")
    runtimes[0].step = 2
    again.take(runtimes[0])
    assert sorted(p.name for p in (memory_root(shm) / "step-00000003").iterdir()) == ["rank-00001"]
    with pytest.raises(ValueError, match="must be one of auto, on, off"):
        MemorySnapshots(shm, 0, "sometimes")


def test_a_failing_save_turns_the_tier_off_without_stopping_training(tmp_path, monkeypatch, capsys):
    from jitckpt.worker import sharding

    monkeypatch.setattr(sharding, "refresh", lambda rt: rt.coords)
    monkeypatch.setattr(sharding, "optimizers", lambda: [object()])
    shm = tmp_path / "shm"
    shm.mkdir()
    tier, rt = MemorySnapshots(shm, 0, "on"), _Runtime(0, shm)

    def broken(path: str) -> None:
        raise OSError(28, "No space left on device")

    rt.save_fn = broken
    assert tier.take(rt) is None and tier.failed
    assert "memory tier off for rank 0: the snapshot of minibatch 0 failed (OSError: [Errno 28] No space left" \
        in capsys.readouterr().err
    assert DiskStore(memory_root(shm)).list_steps() in ([], [0])
    assert not list(memory_root(shm).rglob("state.pt"))  # the partial one is gone


def test_auto_takes_snapshots_only_for_a_single_node_job_whose_state_has_no_copy(tmp_path, monkeypatch, capsys):
    from jitckpt.worker import sharding

    monkeypatch.setattr(sharding, "optimizers", lambda: [object()])
    shm = Path("/dev/shm") / f"jitckpt-test-{tmp_path.name}"  # where jit-run puts it
    cases = [  # (world size, local world size, coordinates) -> snapshots?
        (3, 3, _fsdp(0), True),
        (3, 3, ParallelCoordinates.from_layout(0, 3).with_sharding([]), False),  # DDP: replicas
        (1, 1, ParallelCoordinates.from_layout(0, 1).with_sharding([]), False),  # one process: nothing to protect
        (4, 2, _fsdp(0, 4), False),  # two hosts, and no job store to find the other host's ranks in
    ]
    for world, local, coords, wanted in cases:
        rt = _Runtime(0, shm)
        rt.world_size, rt.local_world_size, rt.coords = world, local, coords
        monkeypatch.setattr(sharding, "refresh", lambda runtime: runtime.coords)
        assert MemorySnapshots(shm, 0)._decide(rt) is wanted, (world, local, coords)
    assert "memory tier off: its snapshots could not be copied to another host" in capsys.readouterr().err
    rt = _Runtime(0, tmp_path)  # no /dev/shm: the run directory stands in, on the checkpoint's file system
    rt.world_size = rt.local_world_size = 3
    assert MemorySnapshots(tmp_path, 0)._decide(rt) is False
    assert "memory tier off: no writable host shared memory" in capsys.readouterr().err


def test_a_forward_elsewhere_or_after_an_optimizer_step_takes_no_snapshot(tmp_path, monkeypatch):
    """Only the training thread of the process that armed it, at a minibatch's start, takes one: not a thread's
    forward, not a forward after an optimizer of the minibatch stepped (a GAN's generator)."""
    import threading

    import torch

    from jitckpt.worker.minibatch import OptimizerPhase

    taken: list[str] = []
    tier = MemorySnapshots(tmp_path, 0, "on")
    monkeypatch.setattr(tier, "take", lambda rt: taken.append(threading.current_thread().name))
    rt = _Runtime(0, tmp_path)
    rt.main_thread = threading.main_thread()
    rt.optimizer_phase = OptimizerPhase(lambda: [])
    layer = torch.nn.Linear(2, 2)
    try:
        tier.arm(rt)
        other = threading.Thread(target=layer, args=(torch.zeros(1, 2),), name="other")
        other.start()
        other.join()
        assert taken == [] and tier._hook is not None  # still armed for the training thread
        rt.optimizer_phase.done = [1]  # an optimizer of this minibatch has stepped
        layer(torch.zeros(1, 2))
        assert taken == [] and tier._hook is None
        rt.optimizer_phase.done = []
        tier.arm(rt)
        with torch.no_grad():
            layer(torch.zeros(1, 2))  # an evaluation forward
        layer(torch.zeros(1, 2))
        assert taken == ["MainThread"]
    finally:
        tier._disarm()
