"""Minibatch boundaries of a Python program in transparent mode (``jitckpt.transparent.phases``).

Under ``jit-run --transparent`` the worker bootstrap registers PyTorch's global
optimizer step hooks, which call ``jitckpt_phase_optimizer_begin`` at a
minibatch's first optimizer pre-step and ``jitckpt_phase_optimizer_end`` when
its optimizer phase ends.  The real functions are ``libjitckpt_remote.so``'s;
here a tiny library built by the test (``cc -shared -fPIC``) exports both and
counts the calls, and is preloaded into a small training script started the
way jit-run starts a worker (its bootstrap on ``PYTHONPATH``,
``JITCKPT_TRANSPARENT=1``).  Without the variable, or without the functions in
the process, nothing is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, job_env
from jitckpt.transparent import phases

BOOTSTRAP = REPO / "jitckpt" / "worker" / "_bootstrap"

FAKE_LIBRARY = r"""
/* Stands in for libjitckpt_remote.so's phase functions: counts the calls, in order. */
static int begins, ends, n;
static char sequence[8192];
void jitckpt_phase_optimizer_begin(void) { begins++; if (n < (int)sizeof sequence - 1) sequence[n++] = 'b'; }
void jitckpt_phase_optimizer_end(void) { ends++; if (n < (int)sizeof sequence - 1) sequence[n++] = 'e'; }
int fake_phase_begins(void) { return begins; }
int fake_phase_ends(void) { return ends; }
const char *fake_phase_sequence(void) { sequence[n] = 0; return sequence; }
"""

SCRIPT = textwrap.dedent("""
    import ctypes, sys
    import torch

    torch.manual_seed(0)
    loop, steps = sys.argv[1], int(sys.argv[2])
    if loop == "one":                      # one optimizer
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    elif loop == "gan":                    # two optimizers per minibatch: discriminator, then generator
        gen, disc = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)
        opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
        for _ in range(steps):
            opt_d.zero_grad()
            disc(gen(torch.randn(8, 2)).detach()).mean().backward()
            opt_d.step()
            opt_g.zero_grad()
            (-disc(gen(torch.randn(8, 2)))).mean().backward()
            opt_g.step()
    elif loop == "scaler":                 # GradScaler skips the step of every third minibatch (inf gradient)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
        taken = []
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(lambda *args: taken.append(1))
        for step in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).mean()
            scaler.scale(loss * (float("inf") if step % 3 == 2 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        print(f"optimizer steps taken {len(taken)}")
    try:
        lib = ctypes.CDLL(None)
        sequence = lib.fake_phase_sequence
    except AttributeError:
        print("no phase functions in the process")
    else:
        sequence.restype = ctypes.c_char_p
        print(f"begins {lib.fake_phase_begins()} ends {lib.fake_phase_ends()} sequence {sequence().decode()}")
    from jitckpt.transparent import phases
    print("hooks installed" if phases.current() is not None else "hooks not installed")
""")


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    directory = tmp_path_factory.mktemp("fake-phase")
    source = directory / "fake_phase.c"
    source.write_text(FAKE_LIBRARY)
    library = directory / "libfake_phase.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("phase-script") / "loop.py"
    path.write_text(SCRIPT)
    return path


def run(script: Path, loop: str, steps: int, preload: Path | None, transparent: bool = True) -> str:
    """The script as jit-run --transparent starts a Python worker (bootstrap on PYTHONPATH), minus the proxy."""
    env = job_env()
    env["PYTHONPATH"] = f"{BOOTSTRAP}:{env['PYTHONPATH']}"
    env.pop("LD_PRELOAD", None)
    env.pop("JITCKPT_TRANSPARENT", None)
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    if transparent:
        env["JITCKPT_TRANSPARENT"] = "1"
    proc = subprocess.run([sys.executable, str(script), loop, str(steps)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[jitckpt]" not in proc.stderr, proc.stderr  # no warning from the bootstrap
    return proc.stdout


def test_one_optimizer_begins_and_ends_every_minibatch(fake_library: Path, script: Path) -> None:
    out = run(script, "one", 5, fake_library)
    assert "begins 5 ends 5 sequence bebebebebe" in out and "hooks installed" in out


def test_two_optimizers_make_one_minibatch(fake_library: Path, script: Path) -> None:
    """A GAN steps its discriminator, then its generator: one begin and one end per minibatch."""
    out = run(script, "gan", 4, fake_library)
    assert "begins 4 ends 4 sequence bebebebe" in out


def test_a_step_gradscaler_skips_still_ends_its_minibatch(fake_library: Path, script: Path) -> None:
    out = run(script, "scaler", 6, fake_library)
    assert "optimizer steps taken 4" in out  # minibatches 2 and 5 were skipped
    assert "begins 6 ends 6 sequence bebebebebebe" in out


def test_nothing_without_transparent_mode_or_without_the_library(fake_library: Path, script: Path) -> None:
    out = run(script, "one", 3, fake_library, transparent=False)
    assert "begins 0 ends 0" in out and "hooks not installed" in out
    out = run(script, "one", 3, None)
    assert "no phase functions in the process" in out and "hooks not installed" in out


class _Optimizer(SimpleNamespace):
    """Just enough of an optimizer for OptimizerPhase: no parameters."""

    def __init__(self) -> None:
        super().__init__(param_groups=[])


def test_phase_marks_follow_the_user_level_notion_of_a_minibatch() -> None:
    """Unit level: ZeRO's nested step is one step; a held optimizer that never steps delays the first end."""
    calls: list[str] = []
    outer, inner = _Optimizer(), _Optimizer()
    marks = phases.PhaseMarks(lambda: calls.append("b"), lambda: calls.append("e"), lambda: [outer, inner])
    for _ in range(3):  # ZeroRedundancyOptimizer: the local optimizer steps inside the outer step
        marks.optimizer_pre_step(outer)
        marks.optimizer_pre_step(inner)
        marks.optimizer_post_step(inner)
        marks.optimizer_post_step(outer)
    assert "".join(calls) == "bebebe" and (marks.begins, marks.ends) == (3, 3)

    calls.clear()
    used, held = _Optimizer(), _Optimizer()
    marks = phases.PhaseMarks(lambda: calls.append("b"), lambda: calls.append("e"), lambda: [used, held])
    marks.optimizer_pre_step(used)
    marks.optimizer_post_step(used)
    assert calls == ["b"]  # `held` might still step in this minibatch
    for _ in range(2):
        marks.optimizer_pre_step(used)
        marks.optimizer_post_step(used)
    # The first minibatch ended at the second one's pre-step (the learned set was complete then).
    assert "".join(calls) == "bebebe"


def test_phase_functions_are_looked_up_in_the_process() -> None:
    assert phases.find_phase_functions() is None  # the test process has no remote library
