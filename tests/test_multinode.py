"""Two jit-run "nodes" on one host, joined by torchrun's c10d rendezvous, like a two-node job.

Each node is its own jit-run (its own torchrun agent, event log, RNG stash and
report); they share the checkpoint directory as nodes share a file system.  A
worker dies on one node: the workers on both nodes save, both agents meet in
the next rendezvous round, and training ends bit-for-bit where the
fault-free single-node run ends.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLE, JOB_TIMEOUT, REPO, TRAIN_ARGS, job_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_nodes(tmp_path: Path, fault: str, max_restarts: int = 2) -> list[tuple[int, str, dict | None]]:
    port = _free_port()
    procs = []
    for node in range(2):
        report = tmp_path / f"node{node}-report.json"
        log = open(tmp_path / f"node{node}.log", "w")
        cmd = [sys.executable, "-m", "jitckpt.cli", "--checkpoint-dir", str(tmp_path / "ckpt"), "--hang-timeout", "3",
               "--save-grace", "30", "--report", str(report), "--fault", fault,
               "torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "jitckpt-two-nodes", "--max-restarts", str(max_restarts),
               str(EXAMPLE), *TRAIN_ARGS]
        procs.append((subprocess.Popen(cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log, report))
    results = []
    for node, (proc, log, report) in enumerate(procs):
        try:
            code = proc.wait(timeout=JOB_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        output = (tmp_path / f"node{node}.log").read_text(errors="replace")
        results.append((code, output, json.loads(report.read_text()) if report.exists() else None))
    return results


def _sha(output: str) -> str | None:
    found = re.findall(r"final parameters sha256 ([0-9a-f]{64})", output)
    return found[-1] if found else None


def test_two_nodes_recover_from_a_dead_worker_bit_exact(tmp_path, fault_free_sha):
    results = _run_two_nodes(tmp_path, "rank=2,step=5,phase=backward,kind=kill")
    for code, output, _ in results:
        assert code == 0, output[-4000:]
    shas = [_sha(output) for _, output, _ in results]
    assert fault_free_sha in shas, [output[-3000:] for _, output, _ in results]
    for _, output, report in results:
        assert report is not None, output[-3000:]
        (failure,) = report["failures"]
        assert failure["resumed_from_minibatch"] == 5, output[-3000:]
    saved_ranks = sorted(s["rank"] for _, _, report in results for s in report["failures"][0]["saves"])
    assert saved_ranks == [0, 1, 3]
    # Every worker of a generation, on either node, used the same rendezvous round
    # to namespace its process-group store; the restart used a new one.
    starts = [json.loads(line) for file in (tmp_path / "ckpt" / ".jitckpt").glob("run-*/events/*.jsonl")
              for line in file.read_text().splitlines() if '"worker_start"' in line]
    rounds = {}
    for start in starts:
        rounds.setdefault(start["attempt"], set()).add(start["rendezvous_round"])
    assert len(starts) == 8 and all(len(r) == 1 and None not in r for r in rounds.values()), starts
    assert rounds[0] != rounds[1]
