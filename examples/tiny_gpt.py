"""A small GPT trained data-parallel with jitckpt's two calls (a PyTorch workload for transparent mode's GPU check).

    torchrun --standalone --nproc_per_node 1 examples/tiny_gpt.py --device cuda --steps 300
    jit-run torchrun --standalone --nproc_per_node 2 --max-restarts 2 examples/tiny_gpt.py --steps 20
    jit-run --transparent torchrun --standalone --nproc_per_node 1 examples/tiny_gpt.py --device cuda

Token embedding and learned positions, ``--layers`` transformer blocks (LayerNorm, causal attention through
``torch.nn.functional.scaled_dot_product_attention``, a GELU MLP), a final LayerNorm and a head tied to the
embedding (``--untied-head``: its own weight); AdamW with weight decay on the matrices, a linear warm-up.
The data are synthetic: every sequence follows a fixed affine rule modulo the vocabulary with some random
tokens in it, each batch a pure function of (seed, step, rank), so the loss falls and a run is deterministic.
Deterministic settings: ``torch.use_deterministic_algorithms(True)``, cuDNN benchmarking off,
``CUBLAS_WORKSPACE_CONFIG`` ``:4096:8`` unless set; the loss is computed with ``gather`` (NLLLoss has no
deterministic CUDA kernel).

Output, as ``train_mlp.py``'s (rank 0): ``step k/N loss L`` every ``--log-every`` steps, ``final parameters
sha256 HEX`` (the state dict in name order, ``mlp_job.parameters_sha256``) and the training loop's time,
start-up and the first warm-up steps excluded: ``tiny_gpt: N steps in S s (M ms/step, after W warm-up steps)``.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before anything creates a cuBLAS handle

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from mlp_job import job_device
from train_loop import add_common_args, run

NAME = "tiny_gpt"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--batch", type=int, default=16, help="sequences per minibatch per rank")
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dim", type=int, default=64, help="model width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--untied-head", action="store_true", help="the output head has its own weight")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--attention", default="default", choices=("default", "math"),
                   help="scaled_dot_product_attention's backends: PyTorch's choice, or the math one only")
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, attention: str) -> None:
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention == "math":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = self.attend(q, k, v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.dim)
        self.wpe = nn.Parameter(torch.zeros(1, args.seq, args.dim))
        self.blocks = nn.ModuleList(Block(args.dim, args.heads, args.attention) for _ in range(args.layers))
        self.ln_f = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.vocab, bias=False) if args.untied_head else None
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.head(x) if self.head is not None else F.linear(x, self.wte.weight)


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = TinyGPT(args).to(job_device(args))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    warmup = 10
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return model, optimizer, scheduler


def batch(args: argparse.Namespace, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token targets for (step, rank): t[i+1] = (a t[i] + b) mod vocab, one token in 8 random."""
    rule = torch.Generator().manual_seed(args.seed)
    a = int(torch.randint(1, args.vocab, (1,), generator=rule)) | 1
    b = int(torch.randint(0, args.vocab, (1,), generator=rule))
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    tokens = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
    noise = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    random = torch.rand(args.batch, args.seq, generator=g) < 0.125
    for i in range(args.seq):
        nxt = (a * tokens[:, i] + b) % args.vocab
        tokens[:, i + 1] = torch.where(random[:, i], noise[:, i], nxt)
    device = job_device(args)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def main() -> None:
    run(parse_args(), NAME, build, batch)


if __name__ == "__main__":
    main()
