"""A Hugging Face Trainer job with no jitckpt code in it (tests/test_frameworks.py runs it).

A tiny GPT-2 built from a config (nothing downloaded), an in-memory dataset the
Trainer shuffles with its own seeding, dropout on, gradient accumulation 2.
Rank 0 prints the sha256 of the final parameters.

JOB_FAULT="kill|hang,rank=R,step=S" makes rank R SIGKILL or SIGSTOP itself in
``on_step_begin`` of global step S, in the first attempt only
(TORCHELASTIC_RESTART_COUNT 0): a failure the script itself knows nothing of.
``,at=H`` places it in callback ``on_H`` at global step S instead:
``prediction_step`` (in the evaluation), ``evaluate`` (at its end),
``epoch_end`` (before the evaluation at an epoch's end), ``epoch_begin`` (after
it, before the epoch's data loader is made).  JOB_EVAL=1: evaluate on 16
sequences at every epoch's end; JOB_EVAL_STEPS=N: every N global steps instead.
JOB_KEEP_BEST=1: save a checkpoint at each epoch's end and load the best one
(lowest evaluation loss) when training ends; JOB_EARLY_STOP=1: that, over 8
epochs, with early stopping (patience 2); JOB_SAVE_STEPS=N: save every N steps
instead.  JOB_CALLBACK_DRAWS=H: a callback draws from the global generator in
``on_H`` (``epoch_end``: before the evaluation; ``save``).
Each rank seeds its global generator with its rank after the Trainer is made
(its dropout and its evaluation's draws are its own).
"""

from __future__ import annotations

import os
import sys

import torch
from job_common import end_cleanly, first_attempt, inject, parse_fault, print_result
from transformers import (EarlyStoppingCallback, GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class FaultInjector(TrainerCallback):
    """Kill or freeze this rank at the start of one global step, in the first attempt only."""

    def __init__(self, spec: str) -> None:
        self.signal, where = parse_fault(spec)
        self.rank, self.step = where["rank"], where["step"]
        self.at = where.get("at", "step_begin")

    def _maybe(self, at: str, args, state) -> None:
        if self.at == at and first_attempt() and args.process_index == self.rank and state.global_step == self.step:
            inject(self.signal, f"rank {self.rank}, global step {self.step}, {at}")

    def on_step_begin(self, args, state, control, **kwargs):
        self._maybe("step_begin", args, state)

    def on_prediction_step(self, args, state, control, **kwargs):
        self._maybe("prediction_step", args, state)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._maybe("epoch_begin", args, state)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._maybe("epoch_end", args, state)

    def on_evaluate(self, args, state, control, **kwargs):
        self._maybe("evaluate", args, state)


class Draws(TrainerCallback):
    """A user's callback that draws from the global generator in one hook (``epoch_end`` or ``save``)."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.hook == "epoch_end":
            torch.rand(3)

    def on_save(self, args, state, control, **kwargs):
        if self.hook == "save":
            torch.rand(3)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "hf-output"
    eval_steps = int(os.environ.get("JOB_EVAL_STEPS", "0"))
    early_stop = os.environ.get("JOB_EARLY_STOP") == "1"
    keep_best = os.environ.get("JOB_KEEP_BEST") == "1" or early_stop
    save_steps = int(os.environ.get("JOB_SAVE_STEPS", "0"))
    evaluate = os.environ.get("JOB_EVAL") == "1" or eval_steps > 0 or keep_best
    args = TrainingArguments(
        output_dir=out,
        num_train_epochs=8 if early_stop else 3,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.01,
        seed=7,
        dataloader_drop_last=True,
        save_strategy="steps" if save_steps else "epoch" if keep_best else "no",
        save_steps=save_steps or 500,
        load_best_model_at_end=keep_best,
        metric_for_best_model="eval_loss" if keep_best else None,
        eval_strategy=("steps" if eval_steps else "epoch") if evaluate else "no",
        eval_steps=eval_steps or None,
        per_device_eval_batch_size=4,
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
    )
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=1)
    set_seed(args.seed)
    model = GPT2LMHeadModel(config)
    callbacks = [FaultInjector(os.environ["JOB_FAULT"])] if os.environ.get("JOB_FAULT") else []
    if os.environ.get("JOB_CALLBACK_DRAWS"):
        callbacks.append(Draws(os.environ["JOB_CALLBACK_DRAWS"]))
    if early_stop:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.025))
    # 64 sequences, 2 ranks x 4 per device x 2 accumulation: 4 optimizer steps per epoch, 12 in all
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(64, 16, 64),
                      eval_dataset=TokenDataset(16, 16, 64) if evaluate else None, callbacks=callbacks)
    torch.manual_seed(100 + args.process_index)  # (Trainer() seeded every rank alike)
    trainer.train()
    if args.process_index == 0:
        print_result(trainer.model.state_dict(), trainer.state.global_step)
    end_cleanly()


if __name__ == "__main__":
    main()
