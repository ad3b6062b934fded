"""A worker that finished its script must end the job cleanly, whatever happens in interpreter teardown.

Found in CI: after a correct recovery, a restarted rank finished training and
then aborted in teardown ("terminate called without an active exception"),
which made torchrun redo the job from the JIT checkpoint.  Cause (core dump):
a gloo worker thread destroying a finished work needed the GIL after the
interpreter had begun finalising (jitckpt/shutdown.py).
"""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, run_jit

PROGRAM = REPO / "tests" / "shutdown_programs" / "finish_and_exit.py"


def test_exit_hands_the_gil_to_gloo_threads(tmp_path: Path) -> None:
    """The GIL race at exit (aborts under plain torchrun) ends cleanly under jit-run, without any rescue."""
    result = run_jit(tmp_path / "ckpt", script=PROGRAM, args=["--mode", "gil-race"], max_restarts=0, timeout=180)
    assert result.returncode == 0, result.output[-4000:]
    assert "terminate called" not in result.output, result.output[-4000:]
    assert result.report["crashes_after_finishing"] == []
    assert result.report["restarts"] == 0


def test_crash_after_a_finished_script_is_not_a_failure(tmp_path: Path) -> None:
    """Rank 2 finishes, then dies from SIGABRT in teardown: the job completes, nobody is restarted or SIGTERMed."""
    result = run_jit(tmp_path / "ckpt", script=PROGRAM, args=["--mode", "crash-after"], max_restarts=1, timeout=180)
    assert result.returncode == 0, result.output[-4000:]
    assert result.output.count("finished training") == 3
    assert result.report["restarts"] == 0, result.output[-4000:]
    assert result.report["crashes_after_finishing"] == [{"rank": 2, "attempt": 0, "signal": 6}]
    assert "closing signal SIGTERM" not in result.output, "the other ranks were torn down"
    assert "rank 2 finished its script in attempt 0, then died from signal 6" in result.output


def test_crash_after_a_failed_script_is_a_failure(tmp_path: Path) -> None:
    """Control: a script that ends with sys.exit(3) and then crashes is a real failure."""
    result = run_jit(tmp_path / "ckpt", script=PROGRAM, args=["--mode", "exit3-crash"], max_restarts=0, timeout=180)
    assert result.returncode != 0, result.output[-4000:]
    assert result.report["crashes_after_finishing"] == []
    assert result.report["outcome"] == "failed"
