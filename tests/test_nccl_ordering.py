"""jitckpt under NCCL's ordering rules, on the ``ncclorder`` test backend (tests/nccl_order).

On NCCL a collective's ``Work.wait()`` and future complete when it is
*enqueued*; it finishes later, compute on its data is queued behind it while
the host runs ahead, the host blocks only where it needs data (``.item()``, a
synchronisation), and a lost peer is an exception on the Work
(``is_completed()``, ``exception()``, ``get_error()``), never on the future.
``ncclorder`` runs gloo under those rules on CPU tensors; its own tests are in
``test_nccl_order_backend.py``.  The tests here:

- check that the fault-free result on ``ncclorder`` is bit-identical to gloo's;
- run the bit-exact acceptance matrix of ``test_recovery.py`` on it (3 ranks,
  short jobs): kill and hang in forward, backward, the all-reduce and the
  optimizer step, raise in backward, a death during the JIT save, and a rank
  that dies in the user's own code between backward and the optimizer step;
- check that a peer frozen right before a collective that C++ waits for
  (DDP's buffer broadcast, on gloo and ``ncclorder``) or before a functional
  collective (``torch.distributed._functional_collectives``, gloo) is caught
  by the hang timeout, and the job ends bit-exact.

What a CPU backend cannot show (real CUDA streams, the GIL during a CUDA
synchronisation, NCCL's own watchdog) is listed in docs/gpus.md, "Running on GPUs".
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import REPO, reference_sha, run_jit

BACKEND = ["--backend", "ncclorder"]
# 3 ranks, 8 minibatches of 2 micro-batches: small enough for 2 cores.
ARGS = ["--steps", "8"]
NPROC = 3
FAILING_RANK = 2
STEP = 4


@pytest.fixture(scope="module")
def gloo_sha() -> str:
    """The fault-free result on plain gloo: the reference for every run on ``ncclorder``."""
    return reference_sha(nproc=NPROC, args=ARGS)


# ----- fault-free ---------------------------------------------------------------------------------


def test_fault_free_result_is_bit_identical_to_gloo(gloo_sha):
    assert reference_sha(nproc=NPROC, args=[*ARGS, *BACKEND]) == gloo_sha


# ----- the acceptance matrix ------------------------------------------------------------------

MATRIX = [
    ("kill", "forward"),
    ("kill", "backward"),
    ("kill", "allreduce"),
    ("kill", "optimizer"),
    ("hang", "forward"),
    ("hang", "backward"),
    ("hang", "allreduce"),
    ("hang", "optimizer"),
    ("raise", "backward"),
]


def _check_recovery(result, expected_sha: str, resumed_from: int | tuple[int, ...], *, hang: bool = False) -> dict:
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == expected_sha, "parameters differ from the fault-free run\n" + result.output[-4000:]
    report = result.report
    assert report["outcome"] == "completed" and report["restarts"] == 1, report
    (failure,) = report["failures"]
    allowed = resumed_from if isinstance(resumed_from, tuple) else (resumed_from,)
    assert failure["resumed_from_minibatch"] in allowed, failure
    assert failure["minibatches_redone"] == 1, failure
    if hang:
        assert any(d["how"] == "hang" for d in failure["detected_by"]), failure
    return failure


@pytest.mark.slow
@pytest.mark.parametrize("kind,phase", MATRIX, ids=[f"{k}-{p}" for k, p in MATRIX])
def test_bit_exact_after_recovery_under_nccl_ordering(tmp_path, gloo_sha, kind, phase):
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, args=[*ARGS, *BACKEND],
                     fault=f"rank={FAILING_RANK},step={STEP},phase={phase},kind={kind}")
    # A failure inside the optimizer step lets the replicas finish it: they save the next minibatch.
    expected = STEP + 1 if phase == "optimizer" else STEP
    failure = _check_recovery(result, gloo_sha, expected, hang=kind == "hang")
    assert {d["rank"] for d in failure["detected_by"]} == {0, 1}, failure
    assert len(failure["saves"]) == 2 and all(s["minibatch"] == expected for s in failure["saves"]), failure


@pytest.mark.slow
def test_a_death_during_the_jit_save_under_nccl_ordering(tmp_path, gloo_sha):
    """Rank 2 dies in backward, rank 1 while saving: rank 0's save is the one used."""
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, args=[*ARGS, *BACKEND],
                     fault=f"rank=2,step={STEP},phase=backward,kind=kill;rank=1,step={STEP},phase=save,kind=kill")
    failure = _check_recovery(result, gloo_sha, STEP)
    assert [s["rank"] for s in failure["saves"]] == [0], failure


CLIP_SCRIPT = REPO / "tests" / "user_programs" / "clip_and_die.py"
CLIP_ARGS = ["--steps", "8", "--accum", "2"]


@pytest.fixture(scope="module")
def clip_gloo_sha() -> str:
    return reference_sha(nproc=NPROC, args=CLIP_ARGS, script=CLIP_SCRIPT)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_death_in_user_code_between_backward_and_step_under_nccl_ordering(tmp_path, clip_gloo_sha, how):
    """Rank 1 dies after its backward, its clipping and ``loss.item()``, before ``optimizer.step()``.  As on
    NCCL, nothing there waits for the all-reduce of minibatch 4 (the clipping is queued behind it, the loss
    does not depend on it), so the rank may die before or after that all-reduce completed: the replicas
    then save minibatch 4 (their pre-step waits for an all-reduce that fails) or finish it and save 5.
    Either is bit-exact, with one minibatch redone."""
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=CLIP_SCRIPT,
                     args=[*CLIP_ARGS, *BACKEND, "--die", f"1:{STEP}:{how}"])
    _check_recovery(result, clip_gloo_sha, (STEP, STEP + 1), hang=how == "stop")
    assert "no RNG state for rank" not in result.output, result.output[-4000:]


# ----- collectives outside torch.distributed's Python API (issue 11, item 6) ----------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "ncclorder"])
def test_a_peer_frozen_before_ddps_buffer_broadcast_is_caught_by_the_hang_timeout(tmp_path, backend):
    """DDP broadcasts rank 0's BatchNorm statistics at the start of every forward (C++ ``_broadcast_coalesced``).

    Rank 2 freezes right before the forward of minibatch 4: rank 0, the root,
    waits in that broadcast for it (gloo hands the data over only to a receiver
    that is ready; on ``ncclorder`` the wait is in the copies out of it), which
    must be in flight for the hang timeout to see it.  (A frozen *root* is
    caught the same way, by the ranks waiting for its data, but is not
    bit-exact: between broadcasts every rank's BatchNorm statistics are its
    own, and rank 0's are lost with it.)
    """
    args = [*ARGS, "--batchnorm"]
    expected = reference_sha(nproc=NPROC, args=args)
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, args=[*args, "--backend", backend],
                     fault=f"rank=2,step={STEP},phase=forward,kind=hang")
    failure = _check_recovery(result, expected, STEP, hang=True)
    # Caught by the hang timeout (before the broadcast was watched the job hung for more than 80 s).  Which
    # rank's watchdog reports first -- rank 0 in the broadcast, or a rank already waiting in the next
    # all-reduce while torchrun stops the workers -- depends on timing, so the detail is not asserted.
    assert any(d["how"] == "hang" for d in failure["detected_by"]) and failure["detect_seconds"] < 30, failure


FUNCOL_PROGRAM = textwrap.dedent(
    """
    \"\"\"train_mlp's job with a functional all-reduce of the step number before every minibatch.

    --die RANK:STEP: that rank freezes (SIGSTOP) right before the functional
    collective of minibatch STEP, in the first attempt only.
    \"\"\"
    import argparse, os, signal, sys
    sys.path.insert(0, os.path.join(os.environ["JITCKPT_TEST_REPO"], "examples"))
    import torch, torch.distributed as dist, torch.nn as nn
    import torch.distributed._functional_collectives as funcol
    from torch.nn.parallel import DistributedDataParallel as DDP
    from mlp_job import add_job_args, build, init_process_group, parameters_sha256, train_step
    from train_mlp import use_jitckpt

    p = argparse.ArgumentParser()
    add_job_args(p)
    p.add_argument("--die", default="")
    args = p.parse_args()
    init_process_group(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    die_rank, die_step = (int(v) for v in args.die.split(":")) if args.die else (-1, -1)
    model, optimizer, scheduler = build(args, rank)
    progress = {"step": 0}
    start, _ = use_jitckpt(model, optimizer, scheduler, progress)
    ddp, loss_fn = DDP(model), nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        if attempt == 0 and (rank, step) == (die_rank, die_step):
            print(f"rank {rank}: freezing before the functional all-reduce of minibatch {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        total = funcol.all_reduce(torch.tensor([float(step)]), "sum", dist.group.WORLD)
        assert total.item() == step * world, (total, step)
        train_step(args, ddp, optimizer, loss_fn, step, rank)
        scheduler.step()
    if rank == 0:
        print(f"final parameters sha256 {parameters_sha256(model)}", flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_a_peer_frozen_before_a_functional_collective_is_caught_by_the_hang_timeout(tmp_path, monkeypatch):
    """On gloo ``wait_tensor`` (called at the first use of the result) blocks until the collective is done: it is in flight."""
    script = tmp_path / "funcol_job.py"
    script.write_text(FUNCOL_PROGRAM)
    monkeypatch.setenv("JITCKPT_TEST_REPO", str(REPO))
    expected = reference_sha(nproc=NPROC, args=ARGS, script=script)
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=script, args=[*ARGS, "--die", f"1:{STEP}"])
    failure = _check_recovery(result, expected, STEP, hang=True)
    assert any("functional collective" in d["detail"] for d in failure["detected_by"] if d["how"] == "hang"), failure
