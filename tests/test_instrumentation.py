"""The torch instrumentation inside one real worker process (gloo, world size 1):
collectives keep their semantics under jitckpt, and forked children behave normally."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import REPO, job_env

WORKER = textwrap.dedent(
    """
    import os, signal, socket, time, multiprocessing as mp
    import torch, torch.distributed as dist
    from jitckpt import worker
    rt = worker.arm()
    assert rt is not None, "runtime not armed"
    dist.init_process_group("gloo")
    t = torch.ones(3)
    dist.all_reduce(t, dist.ReduceOp.SUM, None, False)           # async_op passed positionally
    work = dist.all_reduce(t, async_op=True); work.wait()          # caller-async
    assert work is not None
    with dist._coalescing_manager():                               # placeholder work inside
        dist.all_reduce(t)
    dist.barrier()
    out = torch.zeros(3)
    dist.all_gather_single(out, t); dist.reduce_scatter_single(out, t)   # FSDP2's names, tracked (issue 18)
    dist.all_reduce_coalesced([t, t.clone()]); dist.all_reduce_coalesced([t], async_op=True).wait()
    dist.all_gather_coalesced([[torch.zeros(3)]], [t]); dist.monitored_barrier()
    assert all(getattr(dist, n)._jitckpt_wrapped for n in ("all_gather_single", "isend", "batch_isend_irecv"))
    assert rt.oldest_in_flight() is None, rt.oldest_in_flight()
    assert not rt.park_requested.is_set(), "a healthy collective raised a JIT event"

    def child():
        time.sleep(30)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=child); p.start(); time.sleep(0.5)
    p.terminate(); p.join(5)
    assert p.exitcode == -signal.SIGTERM, p.exitcode               # SIGTERM ends a forked child
    time.sleep(1.0)
    assert not rt.park_requested.is_set(), "the child's SIGTERM woke the parent's watchdog"
    dist.destroy_process_group()
    print("WORKER OK", flush=True)
    """
)


def test_collectives_keep_their_semantics_and_forked_children_are_not_ranks(tmp_path):
    env = job_env()
    env.update({"JITCKPT_ACTIVE": "1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "0", "JITCKPT_CHECKPOINT_DIR": str(tmp_path), "JITCKPT_SHM_DIR": str(tmp_path / "shm")})
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with_port = env | {"MASTER_PORT": str(_free_port())}
    result = subprocess.run([sys.executable, str(script)], env=with_port, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0 and "WORKER OK" in result.stdout, result.stdout + result.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
