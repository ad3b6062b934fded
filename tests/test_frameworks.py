"""Hugging Face Trainer and PyTorch Lightning jobs with no jitckpt code in them, under jit-run.

The scripts (tests/framework_programs/) import only their framework.  A rank
SIGKILLs or SIGSTOPs itself from a framework callback in the first attempt;
jit-run's adapters (jitckpt/adapters/) save the framework's own checkpoint just
in time and make the framework resume from it.  The final parameters must be
bit-for-bit those of the same script under plain torchrun, with exactly one
minibatch redone.  Both jobs: 2 ranks (gloo, CPU), dropout, a shuffled
DataLoader seeded by the framework, gradient accumulation 2, 3 epochs of 4
optimizer steps; one failure mid-epoch, one at the first step of an epoch.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, job_env

pytestmark = pytest.mark.slow

REASON = "needs the frameworks extra (scripts/setup.sh installs it)"
for _framework in ("transformers", "lightning", "pytorch_lightning"):
    # find_spec, not importorskip: importing Lightning costs every pytest process (each xdist worker) ~10 s
    if importlib.util.find_spec(_framework) is None:
        pytest.skip(f"{_framework}: {REASON}", allow_module_level=True)

import torch  # noqa: E402  (after the guard, as the frameworks' own imports are)

PROGRAMS = REPO / "tests" / "framework_programs"
HF_JOB = PROGRAMS / "hf_trainer_job.py"
LIGHTNING_JOB = PROGRAMS / "lightning_job.py"
TIMEOUT = 300


def _run(script: Path, args: list[str], workdir: Path, fault: str = "", jit: bool = True,
         extra_env: dict[str, str] | None = None, expect: int = 0) -> tuple[str, dict | None]:
    """Run ``script`` on 2 ranks under jit-run (or plain torchrun); returns its output and jit-run's report."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**job_env(), **(extra_env or {})}
    env.pop("JOB_FAULT", None)
    if fault:
        env["JOB_FAULT"] = fault
    torchrun = ["torchrun", "--standalone", "--nproc_per_node", "2", "--max-restarts", "2", str(script), *args]
    report = workdir / "report.json"
    if jit:
        cmd = [sys.executable, "-m", "jitckpt", "--checkpoint-dir", str(workdir / "ckpt"), "--hang-timeout", "3",
               "--save-grace", "30", "--report", str(report), *torchrun]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun[1:]]
    proc = subprocess.run(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == expect, proc.stdout[-5000:]
    return proc.stdout, json.loads(report.read_text()) if jit else None


def _sha(output: str) -> str:
    found = re.findall(r"final parameters sha256 ([0-9a-f]{64})", output)
    assert found, output[-3000:]
    return found[-1]


def _one_recovery(report: dict, step: int, output: str) -> None:
    assert report["outcome"] == "completed" and report["restarts"] == 1, output[-5000:]
    (failure,) = report["failures"]
    assert failure["resumed_from_minibatch"] == step, failure
    assert failure["minibatches_redone"] == 1, failure
    assert report["summary"]["minibatches_redone"] == 1, report["summary"]
    assert failure["saves"] and all(s["minibatch"] == step for s in failure["saves"]), failure


def _checkpoints(workdir: Path, step: int) -> list[Path]:
    found = sorted((workdir / "ckpt" / f"step-{step:08d}").glob("rank-*"))
    assert found, f"no JIT checkpoint of minibatch {step}"
    return found


@pytest.fixture(scope="module")
def hf_fault_free(tmp_path_factory) -> str:
    output, _ = _run(HF_JOB, [], tmp_path_factory.mktemp("hf-plain"), jit=False)
    return _sha(output)


HF_CASES = [("kill,rank=1,step=5", 5), ("hang,rank=0,step=8", 8)]


@pytest.mark.parametrize("fault,step", HF_CASES, ids=["kill-mid-epoch", "hang-epoch-start"])
def test_hf_trainer_bit_exact(tmp_path, hf_fault_free, fault, step):
    output, report = _run(HF_JOB, [], tmp_path, fault=fault)
    assert _sha(output) == hf_fault_free, "parameters differ from the fault-free run\n" + output[-5000:]
    _one_recovery(report, step, output)
    if fault.startswith("hang"):
        assert any(d["how"] == "hang" for d in report["failures"][0]["detected_by"]), report["failures"]
    for rank_dir in _checkpoints(tmp_path, step):
        # the Trainer's own layout, its global_step that of the checkpoint, RNG files for both ranks on the host
        names = {p.name for p in rank_dir.iterdir()}
        assert {"model.safetensors", "config.json", "optimizer.pt", "scheduler.pt", "trainer_state.json",
                "training_args.bin", "rng_state_0.pth", "rng_state_1.pth"} <= names, names
        assert json.loads((rank_dir / "trainer_state.json").read_text())["global_step"] == step


@pytest.fixture(scope="module")
def lightning_fault_free(tmp_path_factory) -> str:
    output, _ = _run(LIGHTNING_JOB, [], tmp_path_factory.mktemp("lightning-plain"), jit=False)
    return _sha(output)


# The hang freezes a rank before the second micro-batch: the other one waits in the
# gradient all-reduce that Lightning runs inside optimizer.step(closure).  That run
# imports the framework as pytorch_lightning (the same code under its other name).
# The third kills a rank before the optimizer step that ends epoch 0: the other rank finishes it, makes
# epoch 1's data loader (which draws its base seed from the global generator) and saves minibatch 4 in the
# broadcast Lightning issues before each batch.  Before, the resumed epoch drew other random numbers and the
# job ended with other parameters, reported ``completed``.
LIGHTNING_CASES = [
    ("kill,rank=1,step=5,micro=0", 5, "lightning.pytorch"),
    ("hang,rank=0,step=8,micro=1", 8, "pytorch_lightning"),
    ("kill,rank=1,step=3,at=before_optimizer_step", 4, "lightning.pytorch"),
]


@pytest.mark.parametrize("fault,step,package", LIGHTNING_CASES,
                         ids=["kill-mid-epoch", "hang-epoch-start-in-closure", "kill-before-an-epochs-last-step"])
def test_lightning_bit_exact(tmp_path, lightning_fault_free, fault, step, package):
    output, report = _run(LIGHTNING_JOB, [package], tmp_path, fault=fault)
    assert _sha(output) == lightning_fault_free, "parameters differ from the fault-free run\n" + output[-5000:]
    _one_recovery(report, step, output)
    if fault.startswith("hang"):
        (failure,) = report["failures"]
        assert any(d["how"] == "hang" and d["phase"] == "allreduce" for d in failure["detected_by"]), failure
    elif step == 5:
        assert "skips the 2 batches it already trained on" in output
    for rank_dir in _checkpoints(tmp_path, step):
        checkpoint = torch.load(rank_dir / "lightning.ckpt", weights_only=False)
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.automatic_optimization.optim_progress"]
        assert checkpoint["global_step"] == step and progress["optimizer"]["step"]["total"]["completed"] == step


@pytest.fixture(scope="module")
def hf_eval_fault_free(tmp_path_factory) -> str:
    output, _ = _run(HF_JOB, [], tmp_path_factory.mktemp("hf-eval-plain"), jit=False, extra_env={"JOB_EVAL": "1"})
    return _sha(output)


# The Trainer evaluates at each epoch's end; its evaluation data loader draws a seed from the global generator,
# which each rank seeds with its rank.  Global step 4 is the first of epoch 1.
# - killed in the evaluation, or before it: rank 0 saves minibatch 4 in the evaluation's all-gather, before its
#   end, so nobody's state after it is known and the resumed Trainer would not evaluate again; the adapter runs
#   that evaluation again from each rank's state at step 3's optimizer step (before: a stop, and before that,
#   ``completed`` with other parameters);
# - killed after it (in ``on_evaluate``, or ``on_epoch_begin``): rank 0 saves minibatch 4 after the evaluation,
#   rank 1's state was stashed again when its evaluation loop returned (before: ``completed`` with other
#   parameters, rank 1 resuming from its state before the evaluation);
# - frozen in the evaluation of epoch 1's end (step 8), or killed at step 4's start: the plain cases.
HF_EVAL_CASES = [
    ("kill,rank=1,step=4,at=prediction_step", True),
    ("kill,rank=0,step=4,at=epoch_end", True),
    ("hang,rank=0,step=8,at=prediction_step", True),
    ("kill,rank=1,step=4,at=evaluate", False),
    ("kill,rank=1,step=4,at=epoch_begin", False),
    ("kill,rank=1,step=4", False),
]


@pytest.mark.parametrize("fault,again", HF_EVAL_CASES, ids=["kill-in-evaluation", "kill-before-evaluation",
                         "hang-in-evaluation", "kill-at-its-end", "kill-after-it", "kill-at-the-next-step"])
def test_hf_trainer_evaluating_at_each_epochs_end_bit_exact(tmp_path, hf_eval_fault_free, fault, again):
    step = int(re.search(r"step=(\d+)", fault)[1])
    output, report = _run(HF_JOB, [], tmp_path, fault=fault, extra_env={"JOB_EVAL": "1"})
    assert _sha(output) == hf_eval_fault_free, "parameters differ from the fault-free run\n" + output[-5000:]
    _one_recovery(report, step, output)
    rerun = f"running again the evaluation that followed minibatch {step - 1}"
    assert output.count(rerun) == (2 if again else 0), output[-5000:]  # (by both ranks, or none)


# More of what follows the evaluation, run again or not (found by a red-team run; each ended ``completed`` with
# other parameters before): a callback that draws before the evaluation (the evaluation runs again from the state
# it began with, not the step's); the best checkpoint kept (``load_best_model_at_end``, a save at each epoch's
# end): the evaluation of the last epoch interrupted (no epoch follows: run again before the Trainer finishes and
# loads its best model), and rank 0, which writes the checkpoints, killed after its evaluation (the save alone
# made again); a step's checkpoint saved at an epoch's end, before its evaluation (not made again after it: a
# callback draws on each save); early stopping (its patience counter restored from the checkpoint, which HF does
# only with ``restore_callback_states_from_checkpoint``; and stopping in the evaluation run again: the new epoch
# trains nothing, as the fault-free run ended there).
HF_AFTER_EVAL_CASES = [
    ({"JOB_EVAL": "1", "JOB_CALLBACK_DRAWS": "epoch_end"}, "kill,rank=1,step=4,at=prediction_step", 4,
     "running again the evaluation that followed minibatch 3"),
    ({"JOB_EVAL": "1", "JOB_SAVE_STEPS": "4", "JOB_CALLBACK_DRAWS": "save"}, "kill,rank=1,step=4,at=prediction_step",
     4, "running again the evaluation that followed minibatch 3"),
    ({"JOB_EARLY_STOP": "1"}, "kill,rank=1,step=13", 13, "resuming from minibatch 13"),
    ({"JOB_EARLY_STOP": "1"}, "kill,rank=1,step=16,at=prediction_step", 16,
     "the evaluation run again stopped the training (early stopping), as in the fault-free run"),
    ({"JOB_KEEP_BEST": "1"}, "kill,rank=1,step=12,at=prediction_step", 12,
     "running again the evaluation that followed minibatch 11"),
    ({"JOB_KEEP_BEST": "1"}, "kill,rank=0,step=8,at=evaluate", 8,
     "making again the checkpoint of global step 8 that the failure interrupted"),
]


@pytest.mark.parametrize("env,fault,step,says", HF_AFTER_EVAL_CASES,
                         ids=["callback-draws-before-it", "a-save-before-it-not-made-again", "early-stopping-patience",
                              "early-stopping-in-it", "best-model-last-evaluation", "best-model-save"])
def test_hf_trainer_what_follows_an_evaluation_bit_exact(tmp_path, env, fault, step, says):
    reference, _ = _run(HF_JOB, [], tmp_path / "plain", jit=False, extra_env=env)
    output, report = _run(HF_JOB, [], tmp_path / "jit", fault=fault, extra_env=env)
    assert _sha(output) == _sha(reference), "parameters differ from the fault-free run\n" + output[-5000:]
    assert report["outcome"] == "completed" and report["restarts"] == 1, output[-5000:]
    assert report["failures"][0]["resumed_from_minibatch"] == step, report["failures"]
    assert says in output, output[-5000:]


def test_an_interrupted_evaluation_within_an_epoch_stops_the_job(tmp_path):
    """With ``eval_strategy="steps"`` the Trainer evaluates within the epoch too, after global step 2; rank 1 is
    killed in that evaluation and rank 0 saves minibatch 2 in its all-gather.  The resumed Trainer fetches the
    minibatch's batches before it restores the state, so an evaluation run again could not precede them as in
    the fault-free run, and nobody's state after the evaluation is known: the job stops with the reason."""
    output, report = _run(HF_JOB, [], tmp_path, fault="kill,rank=1,step=2,at=prediction_step",
                          extra_env={"JOB_EVAL_STEPS": "2"}, expect=77)
    assert report["outcome"] == "stopped", report
    assert "drew random numbers between minibatch 1's optimizer step and minibatch 2's start" in output, output[-5000:]
    assert "final parameters sha256" not in output


@pytest.fixture(scope="module")
def lightning_validating_fault_free(tmp_path_factory) -> str:
    output, _ = _run(LIGHTNING_JOB, [], tmp_path_factory.mktemp("lightning-val-plain"), jit=False,
                     extra_env={"JOB_VAL": "1"})
    return _sha(output)


def test_lightning_validating_at_each_epochs_end_bit_exact(tmp_path, lightning_validating_fault_free):
    """Lightning validates at each epoch's end (its loader's seed and noise drawn from the global generator); rank 1
    is killed in the second micro-batch of global step 4, the first of epoch 1, after the first one's start,
    where the adapter stashed its state.  Lightning's resume makes the validation loader's iterator again before
    that start (one more draw than the fault-free run): the adapter's own restore there puts the stashed state
    back.  Before, the restore came only before the epoch's iterator, and the job stopped (and before that, ended
    ``completed`` with other parameters)."""
    output, report = _run(LIGHTNING_JOB, ["lightning.pytorch"], tmp_path, fault="kill,rank=1,step=4,micro=1",
                          extra_env={"JOB_VAL": "1"})
    assert _sha(output) == lightning_validating_fault_free, "parameters differ from the fault-free run\n" + output[-5000:]
    _one_recovery(report, 4, output)


def test_a_lightning_validation_a_killed_rank_never_finished_stops_the_job(tmp_path):
    """Rank 1 is killed in the validation after global step 4; rank 0 saves minibatch 4 in the validation's
    all-reduce.  Nobody's state after the validation is known and Lightning's resume does not validate again:
    the job stops with the reason rather than resume with other random numbers."""
    output, report = _run(LIGHTNING_JOB, ["lightning.pytorch"], tmp_path, fault="kill,rank=1,step=4,at=validation_step",
                          extra_env={"JOB_VAL": "1"}, expect=77)
    assert report["outcome"] == "stopped", report
    assert "drew random numbers between minibatch 3's optimizer step and minibatch 4's start" in output, output[-5000:]
    assert "final parameters sha256" not in output


def test_a_save_function_the_script_registers_wins():
    """The adapters register the framework's save only where the script registered none of its own."""
    from types import SimpleNamespace

    from jitckpt.adapters import base

    def users_save(path):
        pass

    rt = SimpleNamespace(save_fn=users_save)
    assert not base.claim(rt, lambda path: None, "a framework")
    assert rt.save_fn is users_save
    rt = SimpleNamespace(save_fn=None)
    first, second = (lambda path: None), (lambda path: None)
    assert base.claim(rt, first, "a framework") and rt.save_fn is first
    assert base.claim(rt, second, "a framework") and rt.save_fn is second  # a second train()/fit() replaces it
