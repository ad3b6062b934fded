"""examples/tiny_gpt.py and examples/conv_bn.py, the PyTorch workloads of scripts/gpu-check.sh's PyTorch part,
on the CPU: deterministic (two plain torchrun runs, one rank, end with the same parameters), learning (the
loss falls), in train_mlp.py's output format (the checksum line and the timing line gpu-check parses), and
recoverable in user-level mode (2 ranks under jit-run, rank 1 killed in a backward pass: bit-exact with the
fault-free 2-rank run)."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, TEARDOWN_ABORT, reference_sha, run_jit, run_plain

SCRIPTS = {name: REPO / "examples" / f"{name}.py" for name in ("tiny_gpt", "conv_bn")}
ONE_RANK_ARGS = ["--steps", "12", "--log-every", "1"]
TWO_RANK_ARGS = ["--steps", "8", "--log-every", "1000"]


def _finished(result) -> bool:
    """Exit 0, or only torch 2.13's gloo teardown abort after the result was printed (tests/test_shutdown.py)."""
    return result.sha is not None and (result.returncode == 0 or TEARDOWN_ABORT in result.output)


def _losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+/\d+ loss ([0-9.]+)$", output, re.M)]


@pytest.mark.parametrize("name", SCRIPTS)
def test_deterministic_and_learning_on_one_rank(name):
    first = run_plain(1, ONE_RANK_ARGS, SCRIPTS[name])
    second = run_plain(1, ONE_RANK_ARGS, SCRIPTS[name])
    assert _finished(first), first.output[-3000:]
    assert _finished(second), second.output[-3000:]
    assert first.sha == second.sha, "two runs with the same seed ended with different parameters"
    losses = _losses(first.output)
    assert len(losses) == 12, first.output[-3000:]
    assert sum(losses[-3:]) < 0.95 * sum(losses[:3]), f"the loss did not fall: {losses}"
    # the timing line scripts/gpu-check.sh and benchmarks/transparent/pytorch_overhead.py read
    timing = re.search(rf"^{name}: (\d+) steps in ([0-9.]+) s \(([0-9.]+) ms/step, after 5 warm-up steps\)$",
                       first.output, re.M)
    assert timing and int(timing.group(1)) == 7 and float(timing.group(2)) > 0, first.output[-3000:]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_killed_rank_ends_bit_exact_under_jit_run(tmp_path, name):
    want = reference_sha(2, TWO_RANK_ARGS, SCRIPTS[name])
    result = run_jit(tmp_path / "ckpt", fault="rank=1,step=3,phase=backward,kind=kill", nproc=2,
                     args=TWO_RANK_ARGS, script=SCRIPTS[name])
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == want, "parameters differ from the fault-free run\n" + result.output[-4000:]
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == 3 and failure["minibatches_redone"] == 1, failure
