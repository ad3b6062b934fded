"""Transparent mode, milestone 2a: asynchronous calls through the request ring, on the emulator.

Every call of the worker is a record in the shared segment's request ring; an
asynchronous one (a launch, ``cudaMemcpyAsync`` from host memory, ``cudaMemsetAsync``,
``cudaEventRecord``, ``cudaStreamWaitEvent``, NCCL collectives and group calls)
returns as soon as its record is written, and its error is returned by the next
synchronous call (``proxy_server/README.md``, Transport).  These tests check that
the error arrives there, that bursts larger than the ring and the bulk-data arena
(back-pressure, wraparound) give the same results as direct runs, that several
worker threads sharing the one ring keep their order, that a worker whose
proxy dies is told so instead of waiting for ever, that a forked child cannot
write into its parent's ring, and that the generator posts only calls with
nothing to answer.  ``tests/test_proxy.py`` checks
that the milestone-1 programs (and ``cuda_mlp``, 1 and 2 ranks) are unchanged.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from native_toolchain import CUDA_HOME, REQUIRES_CUDA_TOOLCHAIN
from test_emulator import emulator  # noqa: F401  (fixture)
from test_proxy import EMULATOR_BUILD, PROXY, REMOTE_LIB, direct, env, proxy, remote, show  # noqa: F401

pytestmark = REQUIRES_CUDA_TOOLCHAIN

RING_SRC = Path(__file__).resolve().parent / "proxy_programs" / "ring.c"
SMALLEST = {"JITCKPT_PROXY_RING_KIB": "1"}      # clamped to the smallest ring (two largest requests)


@pytest.fixture(scope="session")
def ring(proxy, tmp_path_factory) -> Path:  # noqa: F811
    """tests/proxy_programs/ring.c, a plain C program against the runtime API."""
    out = tmp_path_factory.mktemp("ring-programs") / "ring"
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-o", str(out), str(RING_SRC),
                           "-L", str(EMULATOR_BUILD), "-l:libcudart.so.13", "-lpthread"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_an_asynchronous_error_is_returned_by_the_next_synchronous_call(ring, tmp_path):
    plain = direct(ring, "async_error")
    assert plain.returncode == 0, show(plain)
    assert "cudaMemsetAsync(host pointer): cudaErrorInvalidValue" in plain.stdout
    proc = remote(ring, "async_error", tmp_path=tmp_path)
    assert proc.returncode == 0, show(proc)
    # Posted: the call itself returns at once; the next synchronising call reports it, once.
    assert proc.stdout.splitlines()[:3] == ["cudaMemsetAsync(host pointer): cudaSuccess",
                                            "cudaStreamSynchronize: cudaErrorInvalidValue",
                                            "cudaStreamSynchronize again: cudaSuccess"], show(proc)
    assert "OK async_error" in proc.stdout


def test_the_sync_switch_gives_every_call_its_own_result(ring, tmp_path):
    """JITCKPT_REMOTE_SYNC=1: every call waits for its answer, as in milestone 1."""
    plain = direct(ring, "async_error")
    proc = remote(ring, "async_error", tmp_path=tmp_path, extra={"JITCKPT_REMOTE_SYNC": "1"})
    assert proc.returncode == 0 and proc.stdout == plain.stdout, show(proc)


@pytest.mark.parametrize("sizes", ["default", "smallest"])
def test_a_burst_larger_than_the_ring_and_the_arena_gives_the_same_results(ring, tmp_path, sizes):
    """2000 rounds: ~96 MiB of H2D copies from one pageable buffer rewritten after each call, ~8000
    records, on two streams ordered by events; with the smallest ring and a 2 MiB arena the
    worker waits for room again and again (back-pressure) and both wrap many times."""
    want = direct(ring, "burst", "2000")
    assert want.returncode == 0, show(want)
    extra, proxy_args = ({}, ()) if sizes == "default" else (SMALLEST, ("--arena-mib", "2"))
    got = remote(ring, "burst", "2000", tmp_path=tmp_path, extra=extra, proxy_args=proxy_args)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout and "burst checksum" in got.stdout


def test_worker_threads_share_the_ring_in_call_order(ring, tmp_path):
    want = direct(ring, "threads", "4")
    assert want.returncode == 0, show(want)
    got = remote(ring, "threads", "4", tmp_path=tmp_path, extra=SMALLEST, proxy_args=("--arena-mib", "2"))
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout


def test_a_worker_whose_proxy_dies_is_told_so(proxy, ring, tmp_path):  # noqa: F811
    sock_path = tmp_path / "g.sock"
    # JITCKPT_REMOTE_RESTART=0: no restart of the lost proxy (milestone 2b), the transport's own answer.
    worker = subprocess.Popen(["sh", "-c", f"while [ ! -S {sock_path} ]; do sleep 0.02; done; exec {ring} until_gone"],
                              env=env({"LD_PRELOAD": str(REMOTE_LIB), "JITCKPT_PROXY_SOCKET": str(sock_path),
                                       "JITCKPT_REMOTE_RESTART": "0"}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proxy_proc = subprocess.Popen([str(PROXY), "--socket", str(sock_path), "--worker-pid", str(worker.pid)],
                                  env=env(), stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "started"
        time.sleep(0.2)
        proxy_proc.kill()
        proxy_proc.wait(timeout=10)
        out, err = worker.communicate(timeout=20)
        assert worker.returncode == 0, f"{out}\n{err}"
        assert "until_gone: cudaErrorDevicesUnavailable" in out
        assert "the device proxy is gone" in err
    finally:
        for p in (worker, proxy_proc):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def test_only_calls_with_nothing_to_answer_are_posted_without_waiting():
    """The generator's asynchronous classification (api_facts.py's remote_async column): the
    calls the design names are posted; one that answers (an output) cannot be."""
    import dataclasses
    import sys

    from native_toolchain import NCCL_WHEEL, ROOT

    sys.path.insert(0, str(ROOT / "interpose" / "tools"))
    sys.dont_write_bytecode = True
    try:
        import api_facts
        import gen_interpose
        import gen_remote
    finally:
        sys.path.pop(0)
    posted = {name for name, fact in api_facts.FACTS.items() if fact.remote_async}
    assert posted == {"cudaLaunchKernel", "__cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync",
                      "cudaEventRecord", "cudaStreamWaitEvent", "ncclGroupStart", "ncclGroupEnd",
                      # stream-ordered copies and sets, the attribute launch, an event record with flags
                      "cudaMemcpy2DAsync", "cudaMemset2DAsync", "cudaMemcpyPeerAsync", "cudaMemcpyToSymbolAsync",
                      "cudaMemcpyFromSymbolAsync", "cudaLaunchKernelExC", "cudaEventRecordWithFlags", "cudaGraphLaunch",
                      *api_facts.NCCL_BUFFERS}
    facts = dict(api_facts.FACTS)
    facts["cudaMalloc"] = dataclasses.replace(facts["cudaMalloc"], remote_async=True)
    functions = gen_interpose.describe(CUDA_HOME / "include" / "cuda_runtime_api.h",
                                       NCCL_WHEEL / "include" / "nccl.h", facts)
    with pytest.raises(gen_remote.RemoteGenError, match=r"cudaMalloc: remote_async, but the call answers"):
        gen_remote.check_async(functions)


def test_a_forked_child_cannot_write_into_its_parents_ring(ring, tmp_path):
    """The ring has one producer: a child forked from the worker gets no proxy (its calls fail, said
    on stderr) and the parent's calls go on unharmed."""
    proc = remote(ring, "fork", tmp_path=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "child cudaMalloc: cudaErrorDevicesUnavailable" in proc.stdout
    assert "parent after fork: 7" in proc.stdout and "OK fork" in proc.stdout
    assert "a process forked from a CUDA program has no device proxy" in proc.stderr
