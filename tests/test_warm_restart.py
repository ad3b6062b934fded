"""Warm start (``jitckpt.launch.warm_start``): workers are forked from a template interpreter that imported torch.

- A recovery with warm start on ends bit-for-bit where the fault-free run
  ends, and the report shows every restarted worker was warm.
- A forked worker is indistinguishable to its script from one torchrun
  spawns: ``__name__``, ``sys.argv``, ``sys.path``, the environment,
  stdout/stderr (torchrun's redirects, and inherited), signals, file
  descriptors, its parent (the agent), its random state, an uncaught
  exception's traceback and exit status; as a script and with
  ``torchrun -m``.  The same job with ``--warm-restart off`` is the
  reference, and it records no warm events.
- A template killed before a restart does not break it: a new one is started.
- A template that cannot start means cold starts, said once per group.
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

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent(
    '''
    """Attempt 0: one optimizer step, wait for the standbys (warm restart on), fail.  Attempt 1: describe itself.

    argv: OUT_DIR MODE; MODE "identity": in attempt 1 rank 1 dies from an uncaught exception once rank 0 is done;
    MODE "kill-template": in attempt 0 rank 0 kills the template before failing, attempt 1 ends cleanly.
    """
    import atexit, json, logging, os, pickle, re, signal, sys, threading, time, warnings
    os.environ["OMP_NUM_THREADS"] = "2"  # too late under jit-run, forked or not: its bootstrap imported torch
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
        import torch._dynamo  # (a worker forked from the template has imported it; so does a fresh one at its first optimizer)
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
        with open("/proc/self/cmdline", "rb") as f:  # (what ps and pkill -f see; a forked worker's ends in NULs)
            cmdline = f.read().rstrip(b"\\0").decode().split("\\0")
        return {
            "name": __name__, "argv": sys.argv, "orig_argv": sys.orig_argv, "cmdline": cmdline, "file": globals().get("__file__"),
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
            "fresh_random_state": fresh_random_state(),
            "last_value": hasattr(sys, "last_value"),
            "logging": [logging.root.level, [type(h).__name__ for h in logging.root.handlers]],
            "warning_filters": [(f[0], str(f[1]), getattr(f[2], "__name__", None), str(f[3]), f[4]) for f in warnings.filters],
            "atexit_hooks": atexit._ncallbacks(),
            "sys_modules_agent": sorted(m for m in sys.modules if m.startswith(("jitckpt.launch", "torch.distributed.run",
                                                                             "torch.distributed.launcher"))),
        }


    def fresh_random_state():
        """torch's, numpy's and random's generators as a fresh interpreter leaves them: unseeded, and not
        those of another worker (each worker writes what it drew; the first to find its twin says so)."""
        import random
        import numpy
        drawn = json.dumps([torch.initial_seed(), torch.rand(2).tolist(), numpy.random.rand(2).tolist(), random.random()])
        mine = os.path.join(sys.argv[1], f"random-{os.environ['RANK']}-{os.environ['TORCHELASTIC_RESTART_COUNT']}")
        with open(mine, "w") as f:
            f.write(drawn)
        others = [n for n in os.listdir(sys.argv[1]) if n.startswith("random-") and os.path.join(sys.argv[1], n) != mine]
        return not any(open(os.path.join(sys.argv[1], n)).read() == drawn for n in others)


    def fail_here(rank):
        raise ValueError(f"boom from rank {rank}")


    def main():
        rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        out_dir, mode = sys.argv[1], sys.argv[2]
        if attempt == 0:
            p = torch.nn.Parameter(torch.zeros(1))
            opt = torch.optim.SGD([p], lr=0.1)
            p.grad = torch.ones(1)
            opt.step()
            if rank == 0 and mode == "kill-template":
                events = os.path.join(os.environ["JITCKPT_RUN_DIR"], "events")

                def logged(event):
                    return [json.loads(line) for n in os.listdir(events) for line in open(os.path.join(events, n))
                            if f'"{event}"' in line]

                deadline = time.time() + 120  # (every worker of this attempt forked before the template dies)
                while len(logged("warm_handover")) < int(os.environ["LOCAL_WORLD_SIZE"]) and time.time() < deadline:
                    time.sleep(0.05)
                (ready,) = logged("template_ready")
                with open(f"/proc/{ready['template_pid']}/cmdline", "rb") as f, \\
                        open(os.path.join(out_dir, "template-cmdline"), "wb") as out:
                    out.write(f.read())
                os.kill(ready["template_pid"], signal.SIGKILL)
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


def _probe_job(tmp_path: Path, name: str, warm: str, module: bool, mode: str = "identity",
               first: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start PROBE under jit-run (2 ranks, one restart), output to NAME/output.log; :func:`_probe_result` collects it."""
    out_dir = tmp_path / name
    out_dir.mkdir()
    if module:  # `torchrun -m warm_probe`, output inherited from the agent
        target = ["-m", "warm_probe"]
        redirects: list[str] = []
    else:  # `torchrun probe.py`, output redirected by torchrun into its log files
        target = [str(tmp_path / "warm_probe.py")]
        redirects = ["--redirects", "3", "--log-dir", str(out_dir / "logs")]
    cmd = _jit_run_cmd(out_dir / "ckpt", [*first, "--nproc_per_node", "2", *redirects, *target, str(out_dir), mode], warm,
                       max_restarts=1)
    # per-rank variables the launching environment already has (a Kubernetes PyTorchJob pod exports them): torchrun
    # gives each worker its own, and a template that merely copied the environment must not count them as read
    stale = {"RANK": "7", "LOCAL_RANK": "5", "WORLD_SIZE": "9", "MASTER_PORT": "1"}
    if module:  # started as under `nohup` (SIGHUP ignored): a spawned worker gets SIGHUP's default back (torchrun
        # catches it, exec resets it), so must a warm one, whose template was forked before torchrun's handlers
        cmd = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
               "os.execv(sys.argv[1], sys.argv[1:])", *cmd]
    with open(out_dir / "output.log", "w") as log:
        return subprocess.Popen(cmd, env={**job_env(), **stale}, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


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
    # the agent imported torch and forked the template before torchrun started (its guess of the workers'
    # environment was right: no second template)
    ready = [e for e in runs["on"][2] if e["event"] == "template_ready"]
    assert [e["forked_from_agent"] for e in ready] == [True], ready
    assert not [e for e in runs["on"][2] if e["event"] == "template_lost"], runs["on"][1][-3000:]
    warm_events = [e for e in runs["on"][2] if e["event"] == "warm_start"]
    assert sorted((e["rank"], e["attempt"]) for e in warm_events) == [(0, 0), (0, 1), (1, 0), (1, 1)], runs["on"][1][-3000:]
    assert not [e for e in runs["off"][2] if "warm" in e["event"] or "standby" in e["event"]]

    if module:
        outputs = {warm: _probes(runs[warm][1]) for warm in runs}
    else:
        outputs = {warm: _probes(_attempt1_logs(runs[warm][3], 0, "stdout") + _attempt1_logs(runs[warm][3], 1, "stdout"))
                   for warm in runs}
    assert sorted(outputs["on"]) == sorted(outputs["off"]) == ["0", "1"], outputs
    for rank in ("0", "1"):
        warm, cold = outputs["on"][rank], outputs["off"][rank]
        for key in ("argv", "orig_argv", "cmdline", "path", "cwd"):  # the jobs' own directories differ by name only
            warm[key] = json.loads(json.dumps(warm[key]).replace("/on", "/JOB"))
            cold[key] = json.loads(json.dumps(cold[key]).replace("/off", "/JOB"))
        differing = {k: (warm[k], cold[k]) for k in cold if warm.get(k) != cold[k]}
        assert not differing, f"rank {rank}: warm != cold: {differing}"
        assert cold["name"] == "__main__" and cold["armed_rank"] == int(rank) and cold["session_leader"]
        assert cold["parent_is_agent"] and cold["fresh_random_state"], cold
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
    # 0.5 s per step: the test kills a rank from outside, well before the job's last step (the sleep does
    # not change the numbers)
    cmd = _jit_run_cmd(ckpt, ["--nproc_per_node", "4", str(EXAMPLE), *TRAIN_ARGS, "--step-sleep", "0.5"])
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
    _wait_for(ckpt, proc, log, "first_step_done", 4)
    time.sleep(3.0)  # (a few minibatches in, at 0.5 s each)
    _kill_rank(ckpt, 2)
    output = _finish(proc, log)
    assert _sha(output) == reference_sha(4), output[-4000:]  # _train_job's 4 ranks
    (failure,) = _report(ckpt)["failures"]
    assert failure["warm_ranks"] == [0, 1, 2, 3], failure
    assert failure["minibatches_redone"] == 1, failure
    assert "(4 of 4 workers warm)" in output
    assert not [e for e in _events(ckpt) if e["event"] == "warm_fallback"]


def test_a_template_killed_before_a_restart_is_replaced(tmp_path):
    (tmp_path / "warm_probe.py").write_text(PROBE)
    code, output, events, log_dir = _probe_result(tmp_path, "job", _probe_job(tmp_path, "job", "on", False, "kill-template"))
    assert code == 0, output[-4000:]
    probes = _probes(_attempt1_logs(log_dir, 0, "stdout") + _attempt1_logs(log_dir, 1, "stdout"))
    assert sorted(probes) == ["0", "1"], output[-3000:]
    (ready, _) = [e for e in events if e["event"] == "template_ready"]
    # in ps, the template is the template, not a second agent (it was forked from the agent: its argument area)
    shown = (tmp_path / "job" / "template-cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    assert shown[2:] == [b"-m", b"jitckpt.worker.standby", b"--parent", str(ready["pid"]).encode()], shown
    (lost,) = [e for e in events if e["event"] == "template_lost"]
    assert lost["template_pid"] == ready["template_pid"], (lost, ready)
    assert len([e for e in events if e["event"] == "warm_start"]) == 4, output[-3000:]
    assert not [e for e in events if e["event"] == "warm_fallback"], output[-3000:]
    assert "(2 of 2 workers warm)" in output, output[-3000:]


def test_a_wrong_guess_of_the_workers_environment_means_a_new_template(tmp_path):
    """The agent forks the template before torchrun sets OMP_NUM_THREADS (libgomp reads it when torch loads), so
    it guesses torchrun's setting.  Where the guess is wrong (an option given twice: jit-run reads the first,
    argparse keeps the last), the first worker start finds the agent's environment changed, a template is
    started as before, and the workers have torchrun's setting."""
    from jitckpt.launch.warm_start import omp_threads_torchrun_sets as guess

    assert guess(["--standalone", "--max-restarts", "1", "--nproc_per_node", "2", "t.py", "--nproc_per_node", "1"], {}) == "1"
    assert guess(["--nproc-per-node=1", "t.py"], {}) is None and guess(["t.py"], {}) is None
    assert guess(["t.py"], {"PET_NPROC_PER_NODE": "3"}) == "1"
    assert guess(["--nproc_per_node", "2", "t.py"], {"OMP_NUM_THREADS": "4"}) is None
    assert guess(["--nproc_per_node", "auto", "t.py"], {}) is False and guess(["--nproc", "2", "t.py"], {}) is False

    (tmp_path / "warm_probe.py").write_text(PROBE)
    # the guess reads --nproc_per_node 1 (no setting); torchrun keeps 2 (OMP_NUM_THREADS=1)
    code, output, events, log_dir = _probe_result(
        tmp_path, "job", _probe_job(tmp_path, "job", "on", False, "plain", first=("--nproc_per_node", "1")))
    assert code == 0, output[-4000:]
    ready = [e for e in events if e["event"] == "template_ready"]
    lost = [e for e in events if e["event"] == "template_lost"]
    assert [e["forked_from_agent"] for e in ready] == [False], (ready, lost)
    assert len(lost) == 1 and "changed since it started (OMP_NUM_THREADS)" in lost[0]["error"], lost
    probes = _probes(_attempt1_logs(log_dir, 0, "stdout") + _attempt1_logs(log_dir, 1, "stdout"))
    assert [probes[r]["torch_threads"] for r in ("0", "1")] == [1, 1], probes
    assert [probes[r]["cmdline"] == probes[r]["orig_argv"] for r in ("0", "1")] == [True, True], probes  # (ps)
    assert len([e for e in events if e["event"] == "warm_start"]) == 4, output[-3000:]


class _Handler:
    """What WarmStart reads of torchrun's SubprocessHandler."""

    def __init__(self, local_rank: int) -> None:
        self.local_rank_id = local_rank
        self._stdout = self._stderr = None


def test_a_template_that_cannot_start_means_cold_starts_said_once_per_group(tmp_path, monkeypatch, capsys):
    """A template that exits while importing: that group starts cold, with the reason in one line; after three
    such templates in a row warm start is off for the job (said once), and torchrun spawns every worker."""
    from jitckpt.launch import warm_start

    monkeypatch.setattr(warm_start, "STANDBY_MODULE", "jitckpt.no_such_module")  # python -m exits with status 1
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    starter = warm_start.WarmStart(interpreter=sys.executable)
    spawned = []

    def spawn(handler, args, env):
        spawned.append((handler.local_rank_id, args))
        return subprocess.Popen([sys.executable, "-c", "pass"])

    try:
        for group in range(4):
            for local_rank in range(2):
                env = {**os.environ, "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": str(local_rank)}
                proc = starter.start_worker(_Handler(local_rank), (sys.executable, "-u", str(script)), env, spawn)
                assert isinstance(proc, subprocess.Popen) and proc.wait(30) == 0
            assert len(spawned) == 2 * (group + 1)
    finally:
        starter.close()
    out = capsys.readouterr().err
    cold = re.findall(r"warm restart: local ranks? ([\d, ]+) of 2 start cold: (.*)", out)
    assert [ranks for ranks, _ in cold] == ["0, 1", "0, 1"], out  # groups 0 and 1 (group 2 turns it off)
    assert all("exited with status 1 while importing torch" in why for _, why in cold), out
    assert out.count("off for this job: 3 template interpreters in a row exited while importing torch") == 1, out
    assert starter.disabled


def test_a_worker_command_a_template_cannot_run_is_spawned_by_torchrun():
    from jitckpt.launch import warm_start

    assert "--no-python" in warm_start.parse_worker_command(("/bin/prog", "x"), sys.executable)
    assert "-X" in warm_start.parse_worker_command((sys.executable, "-u", "-X", "dev"), sys.executable)


ORPHANS = textwrap.dedent(
    '''
    """As jit-run's agent: a subreaper whose forked worker (own session) dies and leaves an orphan behind."""
    import json, os, subprocess, sys, time
    from jitckpt.launch import warm_start

    assert warm_start._become_subreaper() is None
    worker = os.fork()
    if worker == 0:  # a worker in its own session, with a child of its own (a DataLoader worker, say)
        os.setsid()
        if os.fork() == 0:
            time.sleep(0.3)  # outlives the worker, then exits: the agent's orphan
            os._exit(0)
        os._exit(0)
    os.waitpid(worker, 0)
    same_session = subprocess.Popen([sys.executable, "-c", "pass"])  # what the agent's own code waits for
    known = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)  # a worker torchrun waits for
    time.sleep(1.0)
    zombies = sorted(p for p in map(int, open(f"/proc/self/task/{os.getpid()}/children").read().split()))
    reaped = warm_start.reap_orphans({known.pid})
    print(json.dumps({"zombies": zombies, "reaped": reaped, "same_session": same_session.pid, "known": known.pid,
                      "waited": [same_session.wait(), known.wait()]}))
    '''
)


def test_the_agent_reaps_the_orphans_it_adopts_and_nothing_it_started(tmp_path):
    (tmp_path / "orphans.py").write_text(ORPHANS)
    proc = subprocess.run([sys.executable, str(tmp_path / "orphans.py")], env=job_env(), capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    (orphan,) = set(result["zombies"]) - {result["same_session"], result["known"]}
    assert result["reaped"] == [orphan], result
    assert result["waited"] == [0, 0], result  # their owners still read their exit status


CUDA_TOUCHED = textwrap.dedent(
    """
    import mmap, os, sys
    import torch
    from jitckpt.worker.standby import cuda_touched

    print(cuda_touched())  # torch imported, no CUDA driver anywhere: None
    with open(sys.argv[1], "rb") as f:  # a file named like the driver library, mapped as a loader maps it
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        print(cuda_touched())
    """
)


def test_a_template_that_touched_the_cuda_driver_never_forks(tmp_path):
    """A worker forked after the CUDA driver was loaded could not use CUDA: the template checks that importing
    torch did not load it (a stand-in file named like the driver library here: no GPU on this machine)."""
    (tmp_path / "probe.py").write_text(CUDA_TOUCHED)
    fake = tmp_path / "libcuda.so.1"
    fake.write_bytes(b"\0" * 4096)
    proc = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(fake)], env=job_env(), capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    clean, touched = proc.stdout.splitlines()
    assert clean == "None"
    assert touched == f"loaded the CUDA driver ({fake})", proc.stdout
