"""Warm restart (``jitckpt.launch.warm_start``): restarted workers come from pre-warmed standby interpreters.

- A recovery with warm restart on ends bit-for-bit where the fault-free run
  ends, and the report shows every restarted worker was warm.
- A worker started from a standby is indistinguishable to its script from
  one torchrun spawns: ``__name__``, ``sys.argv``, ``sys.path``, the
  environment, stdout/stderr (torchrun's redirects, and inherited), signals,
  file descriptors, an uncaught exception's traceback and exit status; as a
  script and with ``torchrun -m``.  The same job with ``--warm-restart off``
  is the reference, and it records no warm events.
- A standby killed before use does not break the restart: that rank starts cold.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import EXAMPLE, JOB_TIMEOUT, REPO, TRAIN_ARGS, job_env, reference_sha

pytestmark = [pytest.mark.slow, pytest.mark.warm_restart]

PROBE = textwrap.dedent(
    '''
    """Attempt 0: one optimizer step, wait for the standbys (warm restart on), fail.  Attempt 1: describe itself.

    argv: OUT_DIR MODE; MODE "identity": in attempt 1 rank 1 dies from an uncaught exception once rank 0 is done;
    MODE "kill-standby": in attempt 0 rank 0 kills one standby before failing, attempt 1 ends cleanly.
    """
    import json, os, pickle, re, signal, sys, threading, time, warnings
    import torch

    started_globals = sorted((k, type(v).__name__) for k, v in dict(globals()).items())
    MASKED = {"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_PORT",
              "JITCKPT_RUN_DIR", "JITCKPT_SHM_DIR", "JITCKPT_CHECKPOINT_DIR", "JITCKPT_REPORT", "JITCKPT_WARM_RESTART",
              "JITCKPT_WORKER_GENERATION", "JITCKPT_RENDEZVOUS_ROUND"}


    class Pickled:
        pass


    def umask():
        mask = os.umask(0)
        os.umask(mask)
        return mask


    def handler_name(h):
        return getattr(h, "__qualname__", None) or str(h)


    def describe():
        fds = {}
        for fd in sorted(os.listdir("/proc/self/fd"), key=int):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            fds[fd] = re.sub(r"\\d+", "N", os.path.basename(target)) if target.startswith("/") else target.split(":")[0]
        stdio = {name: [s.line_buffering, s.write_through, s.encoding, s.errors, type(s.buffer).__name__]
                 for name, s in (("stdout", sys.stdout), ("stderr", sys.stderr))}
        import jitckpt.worker
        rt = jitckpt.worker.current()
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().split(b"\\0")
        return {
            "name": __name__, "argv": sys.argv, "orig_argv": sys.orig_argv, "file": globals().get("__file__"),
            "spec": re.sub(r" at 0x[0-9a-f]+", "", repr(__spec__)), "package": __package__, "loader": type(__loader__).__name__,
            "main_is_module": sys.modules["__main__"].__dict__ is globals(), "globals_at_start": started_globals,
            "path": sys.path, "cwd": os.getcwd(), "flags": repr(sys.flags), "executable": sys.executable,
            "env": {k: ("<masked>" if k in MASKED else v) for k, v in os.environ.items()},
            "rank": os.environ["RANK"], "stdio": stdio, "fds": fds,
            "signals": {s.name: handler_name(signal.getsignal(s)) for s in signal.valid_signals()
                        if isinstance(s, signal.Signals) and s not in (signal.SIGKILL, signal.SIGSTOP)},
            "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            "session_leader": os.getsid(0) == os.getpid() == os.getpgid(0),
            "parent_is_agent": b"jitckpt.launch.agent" in parent, "umask": umask(),
            "nice": os.nice(0), "affinity": sorted(os.sched_getaffinity(0)), "threads": threading.active_count(),
            "armed_rank": rt.rank if rt else None,
            "torch_threads": torch.get_num_threads(), "pickles_main_class": len(pickle.dumps(Pickled())) > 0,
            "last_value": hasattr(sys, "last_value"),
        }


    def fail_here(rank):
        raise ValueError(f"boom from rank {rank}")


    def main():
        rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        out_dir, mode = sys.argv[1], sys.argv[2]
        if attempt == 0:
            p = torch.nn.Parameter(torch.zeros(1))
            opt = torch.optim.SGD([p], lr=0.1)
            p.grad = torch.ones(1)
            opt.step()  # jitckpt logs the first minibatch: the agent starts warming standbys
            if os.environ.get("JITCKPT_WARM_RESTART") == "on":
                events = os.path.join(os.environ["JITCKPT_RUN_DIR"], "events")
                deadline = time.time() + 120
                while time.time() < deadline:
                    ready = [json.loads(line) for n in os.listdir(events) for line in open(os.path.join(events, n))
                             if '"standby_ready"' in line]
                    if len(ready) >= int(os.environ["LOCAL_WORLD_SIZE"]):
                        break
                    time.sleep(0.2)
                if rank == 0 and mode == "kill-standby":
                    os.kill(ready[0]["standby_pid"], signal.SIGKILL)
            if rank == 0:
                sys.exit(3)
            time.sleep(120)
        # one write: with `-m`, both ranks share the agent's stdout, and print()'s separate newline could interleave
        sys.stdout.write("PROBE " + json.dumps(describe(), sort_keys=True) + "\\n")
        sys.stdout.flush()
        print(f"to stderr from rank {rank}", file=sys.stderr, flush=True)
        warnings.warn(f"a warning from rank {rank}")
        if rank == 0 or mode != "identity":
            open(os.path.join(out_dir, "rank0-done"), "w").close()
            return
        while not os.path.exists(os.path.join(out_dir, "rank0-done")):
            time.sleep(0.05)
        time.sleep(0.5)
        fail_here(rank)


    if __name__ == "__main__":
        main()
    '''
)


def _jit_run_cmd(ckpt: Path, torchrun_args: list[str], warm: str = "on", max_restarts: int = 2) -> list[str]:
    return [sys.executable, "-m", "jitckpt", "--checkpoint-dir", str(ckpt), "--hang-timeout", "10", "--save-grace", "30",
            "--report", str(ckpt.parent / f"{ckpt.name}-report.json"), "--warm-restart", warm,
            "torchrun", "--standalone", "--max-restarts", str(max_restarts), *torchrun_args]


def _events(ckpt: Path) -> list[dict]:
    from jitckpt import eventlog

    runs = sorted((ckpt / ".jitckpt").glob("run-*"))
    return eventlog.read_all(runs[-1]) if runs else []


def _report(ckpt: Path) -> dict:
    return json.loads((ckpt.parent / f"{ckpt.name}-report.json").read_text())


def _probe_job(tmp_path: Path, name: str, warm: str, module: bool, mode: str = "identity") -> subprocess.Popen:
    """Start PROBE under jit-run (2 ranks, one restart), output to NAME/output.log; :func:`_probe_result` collects it."""
    out_dir = tmp_path / name
    out_dir.mkdir()
    if module:  # `torchrun -m warm_probe`, output inherited from the agent
        target = ["-m", "warm_probe"]
        redirects: list[str] = []
    else:  # `torchrun probe.py`, output redirected by torchrun into its log files
        target = [str(tmp_path / "warm_probe.py")]
        redirects = ["--redirects", "3", "--log-dir", str(out_dir / "logs")]
    cmd = _jit_run_cmd(out_dir / "ckpt", ["--nproc_per_node", "2", *redirects, *target, str(out_dir), mode], warm, max_restarts=1)
    with open(out_dir / "output.log", "w") as log:
        return subprocess.Popen(cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def _probe_result(tmp_path: Path, name: str, proc: subprocess.Popen) -> tuple[int, str, list[dict], Path]:
    """Exit status, output, events and torchrun log directory of a job started by :func:`_probe_job`."""
    try:
        code = proc.wait(JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out_dir = tmp_path / name
    return code, (out_dir / "output.log").read_text(errors="replace"), _events(out_dir / "ckpt"), out_dir / "logs"


def _probes(output: str) -> dict[str, dict]:
    """Every PROBE record in ``output``, by rank (read with raw_decode: a record need not end its line)."""
    found = {}
    decoder = json.JSONDecoder()
    for match in re.finditer(r"PROBE (?=\{)", output):
        probe, _ = decoder.raw_decode(output, match.end())
        found[probe["rank"]] = probe
    return found


def _attempt1_logs(log_dir: Path, local_rank: int, stream: str) -> str:
    (path,) = log_dir.glob(f"*/attempt_1/{local_rank}/{stream}.log")
    return path.read_text()


@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
def test_a_warm_worker_looks_like_a_fresh_one(tmp_path, module):
    (tmp_path / "warm_probe.py").write_text(PROBE)
    jobs = {warm: _probe_job(tmp_path, warm, warm, module) for warm in ("on", "off")}  # side by side
    runs = {warm: _probe_result(tmp_path, warm, proc) for warm, proc in jobs.items()}
    for warm, (code, output, events, log_dir) in runs.items():
        # attempt 1: rank 0 finishes, rank 1 dies from an uncaught exception -> torchrun gives up
        assert code != 0, output[-3000:]
        failed = [e for e in events if e["event"] == "worker_failed" and e["rank"] == 1]
        assert [e["exitcode"] for e in failed][-1:] == [1], (warm, failed, output[-3000:])
    warm_events = [e for e in runs["on"][2] if e["event"] == "warm_start"]
    assert sorted((e["rank"], e["attempt"]) for e in warm_events) == [(0, 1), (1, 1)], runs["on"][1][-3000:]
    assert not [e for e in runs["off"][2] if "warm" in e["event"] or "standby" in e["event"]]

    if module:
        outputs = {warm: _probes(runs[warm][1]) for warm in runs}
    else:
        outputs = {warm: _probes(_attempt1_logs(runs[warm][3], 0, "stdout") + _attempt1_logs(runs[warm][3], 1, "stdout"))
                   for warm in runs}
    assert sorted(outputs["on"]) == sorted(outputs["off"]) == ["0", "1"], outputs
    for rank in ("0", "1"):
        warm, cold = outputs["on"][rank], outputs["off"][rank]
        for key in ("argv", "orig_argv", "path", "cwd"):  # the jobs' own directories differ by name only
            warm[key] = json.loads(json.dumps(warm[key]).replace("/on", "/JOB"))
            cold[key] = json.loads(json.dumps(cold[key]).replace("/off", "/JOB"))
        differing = {k: (warm[k], cold[k]) for k in cold if warm.get(k) != cold[k]}
        assert not differing, f"rank {rank}: warm != cold: {differing}"
        assert cold["name"] == "__main__" and cold["armed_rank"] == int(rank) and cold["session_leader"]
    if not module:
        for stream in ("stderr", "stdout"):
            for local_rank in (0, 1):
                warm_text = _attempt1_logs(runs["on"][3], local_rank, stream).replace("/on", "/JOB")
                cold_text = _attempt1_logs(runs["off"][3], local_rank, stream).replace("/off", "/JOB")
                if stream == "stdout":
                    warm_text, cold_text = (re.sub(r"PROBE .*", "PROBE", t) for t in (warm_text, cold_text))
                assert warm_text == cold_text, f"{stream} of local rank {local_rank}:\n--- warm\n{warm_text}\n--- cold\n{cold_text}"
        assert "ValueError: boom from rank 1" in _attempt1_logs(runs["on"][3], 1, "stderr")


def _train_job(tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path, Path]:
    ckpt = tmp_path / name / "ckpt"
    ckpt.parent.mkdir()
    # 2 s per step: the 4 standbys must be ready (each imports torch, on a loaded 2-core machine up to ~30 s)
    # well before the job's last step, when the test kills a rank (the sleep does not change the numbers)
    cmd = _jit_run_cmd(ckpt, ["--nproc_per_node", "4", str(EXAMPLE), *TRAIN_ARGS, "--step-sleep", "2.0"])
    log = ckpt.parent / "job.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=job_env(), stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    return proc, ckpt, log


def _wait_for(ckpt: Path, proc: subprocess.Popen, log: Path, event: str, count: int, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in _events(ckpt) if e["event"] == event]
        if len(found) >= count:
            return found
        assert proc.poll() is None, f"the job ended before {count} {event} events:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {count} {event} events in {timeout}s:\n{log.read_text()[-3000:]}")


def _kill_rank(ckpt: Path, rank: int) -> None:
    (start,) = [e for e in _events(ckpt) if e["event"] == "worker_start" and e["rank"] == rank and e["attempt"] == 0]
    os.kill(start["pid"], signal.SIGKILL)


def _finish(proc: subprocess.Popen, log: Path) -> str:
    try:
        code = proc.wait(JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]
    return output


def _sha(output: str) -> str | None:
    found = re.findall(r"final parameters sha256 ([0-9a-f]{64})", output)
    return found[-1] if found else None


def test_recovery_with_warm_workers_is_bit_exact(tmp_path):
    proc, ckpt, log = _train_job(tmp_path, "job")
    _wait_for(ckpt, proc, log, "standby_ready", 4)
    _kill_rank(ckpt, 2)
    output = _finish(proc, log)
    assert _sha(output) == reference_sha(4), output[-4000:]  # _train_job's 4 ranks
    (failure,) = _report(ckpt)["failures"]
    assert failure["warm_ranks"] == [0, 1, 2, 3], failure
    assert failure["minibatches_redone"] == 1, failure
    assert "(4 of 4 workers warm)" in output
    assert not [e for e in _events(ckpt) if e["event"] == "warm_fallback"]


def test_a_standby_killed_before_use_means_a_cold_start_for_that_rank(tmp_path):
    (tmp_path / "warm_probe.py").write_text(PROBE)
    code, output, events, log_dir = _probe_result(tmp_path, "job", _probe_job(tmp_path, "job", "on", False, "kill-standby"))
    assert code == 0, output[-4000:]
    probes = _probes(_attempt1_logs(log_dir, 0, "stdout") + _attempt1_logs(log_dir, 1, "stdout"))
    assert sorted(probes) == ["0", "1"], output[-3000:]
    assert len([e for e in events if e["event"] == "warm_start"]) == 1, output[-3000:]
    assert len([e for e in events if e["event"] == "warm_fallback"]) == 1, output[-3000:]
    assert [e for e in events if e["event"] == "standby_lost"] or "no standby ready" in output, output[-3000:]
    assert re.search(r"warm restart: local rank \d of 2 start cold: ", output), output[-3000:]
    assert "(1 of 2 workers warm)" in output, output[-3000:]
