"""Unit tests of ``jitckpt.worker.minibatch.OptimizerPhase``: when a minibatch ends, and what may be saved.

(The end-to-end cases, real torchrun jobs, are in tests/test_optimizer_phase.py.)
"""

from __future__ import annotations

import torch

from jitckpt.worker.minibatch import OptimizerPhase


def _optimizer(n: int = 2) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(3)) for _ in range(n)], lr=0.1)


def _step(phase: OptimizerPhase, opt: torch.optim.Optimizer) -> tuple[bool, bool]:
    """One plain step of ``opt``: returns (the previous minibatch ended at its pre-step, this one completed)."""
    ended = phase.close_previous(opt)
    phase.enter(opt)
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                p.add_(1.0)
    return ended, phase.post_step(opt)


def test_one_optimizer_ends_every_minibatch_at_its_post_step():
    opt = _optimizer()
    phase = OptimizerPhase(lambda: [opt])
    for _ in range(3):
        assert _step(phase, opt) == (False, True)
        assert not phase.in_phase and not phase.changed()


def test_a_gan_minibatch_spans_both_steps():
    d, g = _optimizer(), _optimizer()
    phase = OptimizerPhase(lambda: [d, g])
    for _ in range(3):
        assert _step(phase, d) == (False, False)
        assert phase.in_phase and phase.changed()  # D at i+1, G at i: never saved
        assert _step(phase, g) == (False, True)
        assert not phase.changed()


def test_an_optimizer_that_never_steps_ends_learning_when_the_first_steps_again():
    used, spare = _optimizer(), _optimizer()
    phase = OptimizerPhase(lambda: [used, spare])
    assert _step(phase, used) == (False, False)  # the spare might still step in this minibatch
    assert _step(phase, used) == (True, True)  # it did not: the set is {used}
    assert _step(phase, used) == (False, True)


def test_zero_nests_its_local_optimizer_step():
    outer, local = _optimizer(), _optimizer()
    phase = OptimizerPhase(lambda: [outer, local])
    for _ in range(2):
        assert not phase.close_previous(outer)
        phase.enter(outer)
        phase.enter(local)
        assert not phase.post_step(local)
        assert phase.changed()  # the local shard is updated, the broadcast is not done
        assert phase.post_step(outer)
        assert not phase.changed()


def test_a_closure_step_is_unchanged_until_a_parameter_moves():
    opt = _optimizer()
    phase = OptimizerPhase(lambda: [opt])
    phase.close_previous(opt)
    phase.enter(opt)
    phase.collective_issued()  # the closure's all-reduce, in the learning minibatch
    assert not phase.changed()
    with torch.no_grad():
        opt.param_groups[0]["params"][1].mul_(2.0)
    assert phase.changed()
    assert phase.post_step(opt)
    phase.close_previous(opt)
    phase.enter(opt)
    assert not phase.changed()  # recorded again for every minibatch (its phase issues collectives)


def test_without_collectives_in_the_phase_nothing_is_recorded_and_inside_counts_as_changed():
    opt = _optimizer()
    phase = OptimizerPhase(lambda: [opt])
    _step(phase, opt)
    phase.close_previous(opt)
    phase.enter(opt)
    assert phase.changed()  # no version pass was made: no proof that nothing moved
    assert phase.post_step(opt)


def test_a_new_training_stage_learns_a_new_set():
    first, second = _optimizer(), _optimizer()
    phase = OptimizerPhase(lambda: [first, second])
    _step(phase, first)
    assert _step(phase, first) == (True, True)  # learned {first}
    assert _step(phase, second) == (False, False)  # a new set, learned again
    assert _step(phase, second) == (True, True)
    assert phase.members == [id(second)]


def test_a_step_that_raised_does_not_stay_inside():
    opt = _optimizer()
    phase = OptimizerPhase(lambda: [opt])
    _step(phase, opt)
    phase.close_previous(opt)
    phase.enter(opt)  # ... raises, no post-step
    phase.close_previous(opt)
    assert phase.enter(opt)  # the retry opens the optimizer phase again
    assert phase.post_step(opt)
    assert not phase.inside
