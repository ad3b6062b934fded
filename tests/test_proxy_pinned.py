"""Transparent mode: pinned host memory shared with the device proxy, on the emulator.

``cudaHostAlloc``/``cudaMallocHost`` in the worker take their pages from a memfd of their own, which the
proxy maps at the same address (the fd travels on the proxy's socket with ``SCM_RIGHTS``, named by a
``JITCKPT_RFN_HOST_REGISTER`` record) and registers with its runtime (``cudaHostRegister``): a host buffer
inside such a region crosses as its own pointer, so an async H2D copy from it needs no bounce through the
arena and an async D2H copy into it returns before the copy is done, as on a GPU
(``interpose/remote/pinned.c``, ``proxy_server/src/pinned.c``, ``proxy_server/README.md`` "Pinned host
memory").  These tests check that results are the direct run's, that the pinned path is really taken (the
proxy's own address space shows the worker's pages at the worker's address; a copy into pinned memory
returns before it is done, one into pageable memory after), that a proxy restart shares the regions again
with the new proxy, that a forked child cannot write into its parent's pinned pages, that
``examples/cuda_mlp`` (pinned staging buffers) ends with the direct run's checksum, and that a recovery
replays the copies from pinned memory with their logged bytes, through the arena.  All on the CPU
emulator; nothing here runs on a GPU.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from native_toolchain import CUDA_HOME, REQUIRES_CUDA_TOOLCHAIN, ROOT
from test_emulator import emulator  # noqa: F401  (fixture)
from test_proxy import EMULATOR_BUILD, PROXY, REMOTE_LIB, direct, env, proxy, remote, show  # noqa: F401
from test_proxy_calllog import mlp  # noqa: F401  (fixture)

pytestmark = REQUIRES_CUDA_TOOLCHAIN

SOURCE = Path(__file__).resolve().parent / "proxy_programs" / "pinned.c"
MLP_DIR = ROOT / "examples" / "cuda_mlp"
PINNED_BASE = 64 << 40            # JITCKPT_WIRE_PINNED_BASE in interpose/include/jitckpt_remote_wire.h
SLOW_MEMSET = {"JITCKPT_SIMDEV_FAULT": "op=cudaMemsetAsync,kind=slow,delay_ms=400"}
CHECKSUM = re.compile(r"final parameters checksum ([0-9a-f]+)")


@pytest.fixture(scope="session")
def pinned(proxy, tmp_path_factory) -> Path:  # noqa: F811
    """tests/proxy_programs/pinned.c, a plain C program against the runtime API."""
    out = tmp_path_factory.mktemp("pinned-programs") / "pinned"
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-o", str(out), str(SOURCE),
                           "-L", str(EMULATOR_BUILD), "-l:libcudart.so.13"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


class Beside:
    """The program with the remote library preloaded, its proxy beside it (--worker-pid), stdin a pipe."""

    def __init__(self, cmd: list[str], tmp_path: Path, extra: dict[str, str] | None = None):
        sock = tmp_path / f"p-{time.monotonic_ns()}.sock"
        quoted = " ".join(f"'{c}'" for c in cmd)
        self.worker = subprocess.Popen(
            ["sh", "-c", f"while [ ! -S {sock} ]; do sleep 0.02; done; exec {quoted}"],
            env=env({"LD_PRELOAD": str(REMOTE_LIB), "JITCKPT_PROXY_SOCKET": str(sock), **(extra or {})}),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.proxy = subprocess.Popen([str(PROXY), "--socket", str(sock), "--worker-pid", str(self.worker.pid)],
                                      env=env(extra), stderr=subprocess.PIPE, text=True)

    def line(self) -> str:
        return self.worker.stdout.readline().strip()

    def go_on(self) -> None:
        self.worker.stdin.write("go\n")
        self.worker.stdin.flush()

    def finish(self, timeout: float = 60) -> subprocess.CompletedProcess:
        try:
            out, err = self.worker.communicate(timeout=timeout)
        finally:
            for p in (self.worker, self.proxy):
                if p.poll() is None:
                    p.kill()
            self.proxy.wait(timeout=10)
        return subprocess.CompletedProcess(self.worker.args, self.worker.returncode, out, err)


def mappings(pid: int, addr: int) -> list[str]:
    """The lines of /proc/PID/maps that start at `addr`."""
    start = f"{addr:x}-"
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if line.startswith(start)]


def serving_proxies(worker: int) -> list[int]:
    """Live jitckpt-proxy processes started with --worker-pid `worker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = next(x for x in (entry / "status").read_text().splitlines() if x.startswith("State:"))
        except (OSError, StopIteration, NotADirectoryError):
            continue
        if args[0].endswith(b"jitckpt-proxy") and "zombie" not in state and b"--worker-pid" in args and \
                args[args.index(b"--worker-pid") + 1] == str(worker).encode():
            found.append(int(entry.name))
    return found


def test_copies_from_and_into_pinned_memory_give_the_direct_runs_results(pinned, tmp_path):
    """100 rounds of async H2D from a reused pinned source, memset, D2D and async D2H into pinned memory:
    the same checksum as directly, also with every call waiting (JITCKPT_REMOTE_SYNC=1), and with a
    1 MiB arena, which could not carry one of the 1.5 MiB copies (the pinned bytes never cross it: a
    pageable buffer of that size is refused)."""
    want = direct(pinned, "copies", "100")
    assert want.returncode == 0 and "copies 100 checksum" in want.stdout, show(want)
    for extra, args in (({}, ()), ({"JITCKPT_REMOTE_SYNC": "1"}, ()), ({}, ("--arena-mib", "1"))):
        got = remote(pinned, "copies", "100", tmp_path=tmp_path, extra=extra, proxy_args=args)
        assert got.returncode == 0 and got.stdout == want.stdout, show(got)
        assert "not shared with the device proxy" not in got.stderr, got.stderr
    pageable = remote(pinned, "pageable", tmp_path=tmp_path, proxy_args=("--arena-mib", "1"))
    assert "pageable copy: cudaErrorNotSupported" in pageable.stdout, show(pageable)


def test_pinned_memory_the_proxy_cannot_map_falls_back_to_the_arena(pinned, tmp_path):
    """The proxy's own device range placed over the pinned range (JITCKPT_PROXY_VA_BASE, reserved at the
    first cudaMalloc, before the program's cudaMallocHost): the proxy cannot map the regions at the
    worker's addresses, says so, and the copies go through the arena with the same results."""
    want = direct(pinned, "copies", "30")
    got = remote(pinned, "copies", "30", tmp_path=tmp_path, extra={"JITCKPT_PROXY_VA_BASE": str(PINNED_BASE)})
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    assert re.search(r"pinned memory at 0x[0-9a-f]+ \(\d+ bytes\) cannot be mapped at the same address in the "
                     r"proxy \(File exists\)", got.stderr), got.stderr
    assert got.stderr.count("is not shared with the device proxy") == 1, got.stderr


def test_the_proxy_maps_the_programs_pinned_pages_at_the_same_address(pinned, tmp_path):
    """The proxy's own address space holds the worker's pinned pages -- the same memfd, at the same
    address, in the pinned range -- until cudaFreeHost unmaps them on both sides."""
    run = Beside([str(pinned), "show"], tmp_path)
    try:
        line = run.line()
        assert line.startswith("pinned 0x"), line
        addr = int(line.split()[1], 16)
        assert PINNED_BASE <= addr < PINNED_BASE + (1 << 40)
        ours, theirs = mappings(run.worker.pid, addr), mappings(run.proxy.pid, addr)
        assert len(ours) == 1 and len(theirs) == 1, (ours, theirs)
        for m in (ours, theirs):
            fields = m[0].split()
            assert fields[0] == f"{addr:x}-{addr + 4 * 4096:x}" and fields[1] == "rw-s", m
            assert "/memfd:jitckpt-pinned" in m[0], m
        assert ours[0].split()[4] == theirs[0].split()[4], "not the same file (inode)"
        run.go_on()
        assert run.line() == "freed"
        assert mappings(run.worker.pid, addr) == [] and mappings(run.proxy.pid, addr) == []
        run.go_on()
    finally:
        proc = run.finish()
    assert proc.returncode == 0 and "OK show" in proc.stdout, show(proc)


def test_a_copy_into_pinned_memory_returns_before_it_is_done(pinned, tmp_path):
    """A D2H copy queued behind a slow memset: into pinned memory the call returns at once (the byte is
    still the old one; after synchronising it is the copied one), into pageable memory only once it is
    done -- through the proxy exactly as directly.  JITCKPT_REMOTE_SYNC=1 makes it wait again."""
    want = direct(pinned, "early", extra=SLOW_MEMSET)
    assert want.returncode == 0, show(want)
    assert "pinned: returned before the copy (byte at return 0x00, after synchronising 0x77)" in want.stdout
    assert "pageable: returned after the copy (byte at return 0x77, after synchronising 0x77)" in want.stdout
    got = remote(pinned, "early", tmp_path=tmp_path, extra=SLOW_MEMSET)
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    waited = remote(pinned, "early", tmp_path=tmp_path, extra={**SLOW_MEMSET, "JITCKPT_REMOTE_SYNC": "1"})
    assert waited.returncode == 0, show(waited)
    assert "pinned: returned after the copy (byte at return 0x77" in waited.stdout, show(waited)


def test_a_proxy_restart_shares_the_pinned_memory_with_the_new_proxy(pinned, tmp_path):
    """A driver-suspect restart (JITCKPT_REMOTE_RESTART_AT) in the middle of the copies: the results are
    the direct run's, and the new proxy maps the live regions at their addresses before any call uses
    them."""
    want = direct(pinned, "copies", "60")
    got = remote(pinned, "copies", "60", tmp_path=tmp_path, extra={"JITCKPT_REMOTE_RESTART_AT": "200"})
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    assert "device proxy restarted (driver suspect)" in got.stderr, got.stderr
    assert "not shared with the device proxy" not in got.stderr, got.stderr

    # the restart before the program's 2nd counted call (cudaMemcpy from the pinned buffer; cudaMallocHost
    # is not counted): the region is in the new proxy's address space
    run = Beside([str(pinned), "show"], tmp_path, extra={"JITCKPT_REMOTE_RESTART_AT": "2"})
    try:
        line = run.line()
        assert line.startswith("pinned 0x"), line
        addr = int(line.split()[1], 16)
        new = [p for p in serving_proxies(run.worker.pid) if p != run.proxy.pid]
        assert len(new) == 1, new
        assert run.proxy.poll() is not None, "the old proxy was replaced"
        assert len(mappings(new[0], addr)) == 1 and "/memfd:jitckpt-pinned" in mappings(new[0], addr)[0]
        run.go_on()
        assert run.line() == "freed"
        assert mappings(new[0], addr) == []
        run.go_on()
    finally:
        proc = run.finish()
    assert proc.returncode == 0 and "device proxy restarted (driver suspect)" in proc.stderr, show(proc)


def test_a_forked_child_cannot_write_into_its_parents_pinned_memory(pinned, tmp_path):
    """The child's CUDA calls fail (it has no proxy), and its writes stay in its own private copy: the
    parent's pinned bytes, and its copies from and to them, are unchanged."""
    proc = remote(pinned, "fork", tmp_path=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "child: cudaMemcpy cudaErrorDevicesUnavailable" in proc.stdout
    assert "parent: byte after the child wrote 1" in proc.stdout
    assert "parent: round trip equal" in proc.stdout and "OK fork" in proc.stdout


def test_cuda_mlp_one_rank_shares_its_staging_buffers_and_ends_with_the_direct_checksum(mlp, tmp_path):  # noqa: F811
    """examples/cuda_mlp allocates its input staging buffers and its loss buffer with cudaMallocHost: all
    three are shared with the proxy (its --verbose log says so), every minibatch still logs its step's
    upload with its bytes, and the run ends with the direct run's checksum."""
    ranks = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
             "JITCKPT_SIMDEV_KERNELS": str(MLP_DIR / "build" / "libmlp_twins.so")}
    for name in ("rv-direct", "rv-proxy"):
        (tmp_path / name).mkdir()
    want = direct(mlp, "--steps", "12", "--rendezvous-dir", str(tmp_path / "rv-direct"), extra=ranks, timeout=120)
    assert want.returncode == 0, show(want)
    got = remote(mlp, "--steps", "12", "--rendezvous-dir", str(tmp_path / "rv-proxy"), tmp_path=tmp_path,
                 extra={**ranks, "JITCKPT_REMOTE_LOG_TRACE": "1"}, proxy_args=("--verbose",), timeout=120)
    assert got.returncode == 0, show(got)
    assert CHECKSUM.search(got.stdout).group(1) == CHECKSUM.search(want.stdout).group(1)
    assert len(re.findall(r"pinned memory at 0x[0-9a-f]+ \(\d+ bytes\) shared with the worker", got.stderr)) == 3
    inputs = [int(m) for m in re.findall(r"call log: minibatch \d+ ended: \d+ calls, \d+ bytes, (\d+) input bytes",
                                         got.stderr)]
    assert len(inputs) == 12 and set(inputs[1:]) == {(32 * 32 + 32) * 4}, got.stderr


def test_a_recovery_replays_the_copies_from_pinned_memory_with_their_logged_bytes(mlp, tmp_path):  # noqa: F811
    """3 ranks, a hang in an all-reduce at step 8: every rank replays its log from minibatch 7, whose
    H2D upload came from pinned memory; the replay sends the logged bytes through the arena (and so does
    replay validation at minibatch 5), and every rank ends with the fault-free run's checksum."""
    from test_proxy_recovery import assert_recovered, torchrun

    reference = torchrun(mlp, tmp_path, False)
    sums = set(re.findall(r"\[rank \d\] final parameters checksum ([0-9a-f]+)", reference.stdout))
    assert reference.returncode == 0 and len(sums) == 1, reference.stdout + reference.stderr
    proc = torchrun(mlp, tmp_path, True, {"JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang",
                                          "JITCKPT_REMOTE_REPLAY_TRACE": "1"})
    out = assert_recovered(proc, sums.pop(), minibatch=7)
    replayed = re.findall(r"jitckpt remote\[(\d+)\]: replay: fn \d+ .*\((\d+) from pinned memory\)", out)
    from_pinned = {pid for pid, n in replayed if n != "0"}
    assert len(from_pinned) == 3, out[-6000:]       # every rank's worker replayed copies from pinned memory
