"""Transparent mode, milestone 3a: the minibatch call log (recording only), on the emulator.

The worker's remote library keeps every call it forwarded to its device proxy since the start of
the current minibatch -- the ring's request record plus the bytes of its host inputs -- and clears
it when the program calls ``jitckpt_phase_optimizer_end()`` (``interpose/remote/calllog.c``,
``interpose/include/jitckpt_remote_calllog.h``, ``proxy_server/README.md``, "The call log").
``examples/cuda_mlp`` looks the phase functions up with ``dlsym`` around its Adam step, so it runs
unchanged without jitckpt.  ``JITCKPT_REMOTE_LOG_TRACE=1`` makes the library say the log's stats at
every minibatch end and at exit, which is what these tests read; ``JITCKPT_REMOTE_LOG_MIB`` caps it.
Replay is a later milestone: nothing here replays the log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from native_toolchain import CUDA_HOME, REQUIRES_CUDA_TOOLCHAIN, ROOT
from test_emulator import emulator  # noqa: F401  (fixture)
from test_proxy import EMULATOR_BUILD, PROXY, REMOTE_LIB, direct, env, proxy, remote, show  # noqa: F401

pytestmark = REQUIRES_CUDA_TOOLCHAIN

MLP_DIR = ROOT / "examples" / "cuda_mlp"
RING_SRC = Path(__file__).resolve().parent / "proxy_programs" / "ring.c"
PASSTHROUGH_LIB = ROOT / "interpose" / "build" / "libjitckpt_interpose.so"
BATCH = 32
UPLOAD_PER_STEP = (BATCH * 32 + BATCH) * 4      # cuda_mlp's x (batch x 32 inputs) and y, float32, one H2D per step
CHUNK = 48 * 1024 + 8                           # ring.c's copy size
TRACE = {"JITCKPT_REMOTE_LOG_TRACE": "1"}
ENDED = re.compile(r"call log: minibatch (\d+) ended: (\d+) calls, (\d+) bytes, (\d+) input bytes, "
                   r"optimizer phase from call (-?\d+) \((logging|off)\)")
AT_EXIT = re.compile(r"call log at exit: minibatch (\d+): (\d+) calls, (\d+) bytes, (\d+) input bytes, "
                     r"(\d+) calls logged in all \((logging|off)\)")
OFF = "the call log is off for the rest of this process: replay is unavailable"
CHECKSUM = re.compile(r"final parameters checksum ([0-9a-f]+)")


@pytest.fixture(scope="session")
def mlp(proxy) -> Path:  # noqa: F811
    proc = subprocess.run(["make", "-C", str(MLP_DIR), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make -C examples/cuda_mlp failed:\n{proc.stdout}\n{proc.stderr}"
    return MLP_DIR / "build" / "mlp"


@pytest.fixture(scope="session")
def ring(proxy, tmp_path_factory) -> Path:  # noqa: F811
    """tests/proxy_programs/ring.c: calls no phase function (one long minibatch)."""
    out = tmp_path_factory.mktemp("calllog-programs") / "ring"
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-o", str(out), str(RING_SRC),
                           "-L", str(EMULATOR_BUILD), "-l:libcudart.so.13", "-lpthread"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def run_mlp(mlp: Path, tmp_path: Path, steps: int, through_proxy: bool, extra: dict[str, str] | None = None):
    rendezvous = tmp_path / f"rv-{len(list(tmp_path.iterdir()))}"
    rendezvous.mkdir()
    args = ("--steps", str(steps), "--rendezvous-dir", str(rendezvous))
    ranks = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
             "JITCKPT_SIMDEV_KERNELS": str(MLP_DIR / "build" / "libmlp_twins.so"), **(extra or {})}
    if through_proxy:
        return remote(mlp, *args, tmp_path=tmp_path, extra=ranks, timeout=120)
    return direct(mlp, *args, extra=ranks, timeout=120)


def test_cuda_mlp_log_is_cleared_at_every_minibatch_and_holds_the_uploads(mlp, tmp_path):
    """One line per minibatch end: indices 0..steps-1, the log restarts empty each time, so each
    minibatch after the first holds exactly the step's one upload
    (x and y) as input bytes, and the optimizer phase is the last calls of it (the Adam launch).  The
    run ends as directly, where dlsym finds no phase function."""
    steps = 12
    want = run_mlp(mlp, tmp_path, steps, through_proxy=False)
    assert want.returncode == 0, show(want)
    assert "call log" not in want.stderr
    got = run_mlp(mlp, tmp_path, steps, through_proxy=True, extra=TRACE)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout.replace(re.search(r"in [0-9.]+ s", want.stdout).group(0),
                                             re.search(r"in [0-9.]+ s", got.stdout).group(0))
    assert CHECKSUM.search(got.stdout).group(1) == CHECKSUM.search(want.stdout).group(1)

    ended = [tuple(m.groups()) for m in ENDED.finditer(got.stderr)]
    assert [int(m[0]) for m in ended] == list(range(steps)), got.stderr
    assert all(m[5] == "logging" for m in ended)
    first, rest = ended[0], ended[1:]
    # Minibatch 0 also holds the set-up: the fatbinary image and the initial parameters.
    assert int(first[3]) > UPLOAD_PER_STEP
    # Cleared at every minibatch end: each one holds exactly its own step's upload, never the sum of
    # earlier ones.  (The number of calls varies with timing: mlp polls its events with cudaEventQuery.)
    for _, calls, size, inputs, optimizer, _ in rest:
        assert int(inputs) == UPLOAD_PER_STEP, got.stderr
        assert 0 < int(optimizer) < int(calls)
        assert int(calls) - int(optimizer) <= 3      # the Adam launch and its error check
        assert int(size) > UPLOAD_PER_STEP
    at_exit = AT_EXIT.search(got.stderr)
    assert at_exit and int(at_exit.group(1)) == steps and at_exit.group(6) == "logging", got.stderr
    assert int(at_exit.group(5)) == sum(int(m[1]) for m in ended) + int(at_exit.group(2))


def test_a_program_that_never_marks_minibatches_logs_until_the_cap_then_is_told_once(ring, tmp_path):
    """ring.c calls no phase function: its whole run is minibatch 0.  Under the default cap the log
    holds every call and every H2D byte; under a 2 MiB cap logging is switched off once, with one
    message, and the program's results are unchanged."""
    want = direct(ring, "burst", "100")
    assert want.returncode == 0, show(want)
    got = remote(ring, "burst", "100", tmp_path=tmp_path, extra=TRACE)
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    at_exit = AT_EXIT.search(got.stderr)
    assert at_exit, got.stderr
    minibatch, calls, size, inputs, total, state = at_exit.groups()
    assert (minibatch, state) == ("0", "logging")
    assert int(calls) == int(total) >= 100
    assert int(inputs) >= 100 * CHUNK and int(size) > int(inputs)
    assert OFF not in got.stderr

    capped = remote(ring, "burst", "100", tmp_path=tmp_path, extra={**TRACE, "JITCKPT_REMOTE_LOG_MIB": "2"})
    assert capped.returncode == 0 and capped.stdout == want.stdout, show(capped)
    assert capped.stderr.count(OFF) == 1, capped.stderr
    assert re.search(r"call log: minibatch 0 needs more than JITCKPT_REMOTE_LOG_MIB=2 MiB", capped.stderr)
    at_exit = AT_EXIT.search(capped.stderr)
    assert at_exit and at_exit.group(6) == "off" and at_exit.group(2) == "0", capped.stderr


def test_the_cap_switches_off_cuda_mlp_logging_and_the_run_goes_on(mlp, tmp_path):
    """JITCKPT_REMOTE_LOG_MIB=0: no log at all, said once at the first call; the minibatch ends still
    count, and the run ends with the same checksum."""
    want = run_mlp(mlp, tmp_path, 5, through_proxy=False)
    got = run_mlp(mlp, tmp_path, 5, through_proxy=True, extra={**TRACE, "JITCKPT_REMOTE_LOG_MIB": "0"})
    assert got.returncode == 0, show(got)
    assert CHECKSUM.search(got.stdout).group(1) == CHECKSUM.search(want.stdout).group(1)
    ended = [m.groups() for m in ENDED.finditer(got.stderr)]
    assert [int(m[0]) for m in ended] == list(range(5))
    assert all(m[1] == "0" and m[5] == "off" for m in ended), got.stderr
    assert got.stderr.count("call log: off (JITCKPT_REMOTE_LOG_MIB=0): replay is unavailable") == 1, got.stderr


STATS = textwrap.dedent("""
    import ctypes, sys
    class Stats(ctypes.Structure):
        _fields_ = [("minibatch", ctypes.c_uint64), ("calls", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                    ("input_bytes", ctypes.c_uint64), ("optimizer_call", ctypes.c_int64),
                    ("optimizer_bytes", ctypes.c_uint64), ("cap_bytes", ctypes.c_uint64),
                    ("total_calls", ctypes.c_uint64), ("enabled", ctypes.c_int32), ("in_optimizer", ctypes.c_int32)]
    lib = ctypes.CDLL(sys.argv[1])
    s = Stats()
    def show():
        assert lib.jitckpt_remote_log_stats(ctypes.byref(s)) == 0
        print(s.minibatch, s.calls, s.optimizer_call, s.in_optimizer, s.enabled, s.cap_bytes >> 20)
    show()
    lib.jitckpt_phase_optimizer_begin()
    show()
    lib.jitckpt_phase_optimizer_end()
    lib.jitckpt_phase_optimizer_end()
    show()
    print(lib.jitckpt_remote_log_entry(ctypes.c_uint64(0), None))
""")


def test_the_stats_interface_and_the_phase_functions_without_a_proxy(proxy):  # noqa: F811
    """jitckpt_remote_log_stats as a test or a tool reads it (no CUDA call, so no proxy needed):
    the minibatch counts the ends, optimizer_call marks the begin; the cap comes from
    JITCKPT_REMOTE_LOG_MIB (default 1024 MiB, 0: off).  The passthrough library exports the phase
    functions too (no-ops), so a program finds the same names under either library."""
    run = [sys.executable, "-c", STATS, str(REMOTE_LIB)]
    out = subprocess.run(run, env=env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, show(out)
    assert out.stdout.split("\n")[:4] == ["0 0 -1 0 1 1024", "0 0 0 1 1 1024", "2 0 -1 0 1 1024", "-1"]
    off = subprocess.run(run, env=env({"JITCKPT_REMOTE_LOG_MIB": "0"}), capture_output=True, text=True, timeout=60)
    assert off.returncode == 0 and off.stdout.split("\n")[0] == "0 0 -1 0 0 0", show(off)
    exported = subprocess.run(["nm", "-D", "--defined-only", str(PASSTHROUGH_LIB)], capture_output=True, text=True,
                              check=True).stdout
    assert "jitckpt_phase_optimizer_begin@@JITCKPT_INTERPOSE_1" in exported
    assert "jitckpt_phase_optimizer_end@@JITCKPT_INTERPOSE_1" in exported


def test_a_proxy_restart_mid_run_logs_the_programs_calls_only(mlp, tmp_path):
    """A driver-suspect restart injected before the 200th call (of ~330 in 12 steps): the restart
    protocol's own calls (copies out and back, re-registration) are not in the log, so every
    minibatch still holds exactly its step's upload, and the run ends with the direct run's checksum."""
    want = run_mlp(mlp, tmp_path, 12, through_proxy=False)
    got = run_mlp(mlp, tmp_path, 12, through_proxy=True, extra={**TRACE, "JITCKPT_REMOTE_RESTART_AT": "200"})
    assert got.returncode == 0, show(got)
    assert "device proxy restarted (driver suspect)" in got.stderr, got.stderr
    assert CHECKSUM.search(got.stdout).group(1) == CHECKSUM.search(want.stdout).group(1)
    ended = [m.groups() for m in ENDED.finditer(got.stderr)]
    assert [int(m[0]) for m in ended] == list(range(12))
    assert all(int(m[3]) == UPLOAD_PER_STEP for m in ended[1:]), got.stderr
