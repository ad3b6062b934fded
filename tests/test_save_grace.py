"""jit-run's --save-grace and frozen workers on every torchrun teardown path (issue 10, defect 1).

When a worker dies, torchrun's process context (``SubprocessContext._poll``)
tears the others down itself, with its own 30 s default.  These jobs check,
from the user's side, that the grace period is the one jit-run sets and that a
frozen worker does not hold the restart.
"""

from __future__ import annotations

import pytest

from conftest import JobResult, reference_sha, run_jit

pytestmark = pytest.mark.slow

NPROC = 3
FAULT_RANK = 2
FAULT_STEP = 5
SAVE_SLEEP = 35.0  # longer than torchrun's 30 s default teardown timeout

SCRIPT = r'''
"""3-rank DDP over gloo; one rank kills or stops itself in forward of a chosen step (attempt 0 only)."""
import argparse, hashlib, os, signal, time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import jitckpt

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--fault", choices=["none", "kill", "stop"], default="none")
p.add_argument("--fault-rank", type=int, default=2)
p.add_argument("--fault-step", type=int, default=5)
p.add_argument("--save-sleep", type=float, default=0.0)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
progress = {"step": 0}


def save(path):
    time.sleep(args.save_sleep)  # a slow store
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": progress["step"]}
    torch.save(state, os.path.join(path, "state.pt"))


jitckpt.register_save_checkpoint(save)
start = 0
path = jitckpt.jit_get_checkpoint_path()
if path:
    state = torch.load(os.path.join(path, "state.pt"))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["step"]

faulty = args.fault != "none" and rank == args.fault_rank and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def fault_in_forward(module, inputs):
    if faulty and progress["step"] == args.fault_step:
        os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)


model.register_forward_pre_hook(fault_in_forward)
ddp = DDP(model)
for step in range(start, args.steps):
    progress["step"] = step
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True).sin()).backward()
    optimizer.step()

if rank == 0:
    digest = hashlib.sha256(b"".join(q.detach().numpy().tobytes() for q in model.parameters())).hexdigest()
    print(f"final parameters sha256 {digest}", flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("save_grace") / "train_ddp.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def fault_free_sha(script):
    """The script under plain torchrun, without a fault (jitckpt is a no-op there)."""
    return reference_sha(nproc=NPROC, script=script)


def _single_recovery(result: JobResult, fault_free_sha: str) -> dict:
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == fault_free_sha, "parameters differ from the fault-free run\n" + result.output[-4000:]
    assert result.report["restarts"] == 1, result.report
    (failure,) = result.report["failures"]
    assert not failure["restarted_fresh"], failure
    assert failure["resumed_from_minibatch"] == FAULT_STEP, failure
    assert failure["minibatches_redone"] == 1, failure
    assert sorted(s["rank"] for s in failure["saves"]) == [r for r in range(NPROC) if r != FAULT_RANK], failure
    return failure


def test_a_save_longer_than_30s_is_committed_within_the_save_grace(tmp_path, script, fault_free_sha):
    """A rank dies; the healthy ranks' save takes 35 s, under --save-grace 90: it must not be killed at 30 s."""
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=script, jit_options=["--save-grace", "90"],
                     args=["--fault", "kill", "--save-sleep", str(SAVE_SLEEP)])
    failure = _single_recovery(result, fault_free_sha)
    assert failure["save_seconds"] >= SAVE_SLEEP, failure
    assert any(f"rank {FAULT_RANK}: killed by signal 9" in w for w in failure["what_failed"]), failure


@pytest.mark.serial  # times the restart (< 15 s): alone, not beside other jobs
def test_a_frozen_worker_does_not_hold_the_restart(tmp_path, script, fault_free_sha):
    """A rank SIGSTOPs itself in forward; once the others have saved it is killed at once, not after 30 s."""
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=script, jit_options=["--save-grace", "60"],
                     args=["--fault", "stop"])
    failure = _single_recovery(result, fault_free_sha)
    assert any(f"rank {FAULT_RANK}: hung (process frozen)" in w for w in failure["what_failed"]), failure
    assert failure["restart_seconds"] < 15, failure
