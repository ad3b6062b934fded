"""Two jobs never read each other's checkpoints by default; a requeued job and a rerun command resume;
leftovers of saves that died are cleaned up, saves still running are not."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jitckpt import config
from jitckpt.launch.launcher import default_checkpoint_dir
from jitckpt.store import DiskStore, ParallelCoordinates
from jitckpt.store.disk import PendingSave

TRAIN = ["torchrun", "--nproc_per_node", "4", "train.py", "--lr", "0.1"]


def test_different_commands_get_different_directories_and_a_rerun_gets_the_same(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    clean = {}
    first = default_checkpoint_dir(TRAIN, clean)
    assert first == default_checkpoint_dir(list(TRAIN), clean)  # the same command again: resumes
    assert first.parent == Path(config.DEFAULT_CHECKPOINT_DIR) and first.name.startswith("train-")
    assert default_checkpoint_dir([*TRAIN[:-1], "0.2"], clean) != first  # another job
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert default_checkpoint_dir(TRAIN, clean) != first  # the same script from another directory


def test_a_scheduler_job_id_names_the_directory_so_a_requeued_job_resumes():
    env = {"SLURM_JOB_ID": "4711"}
    assert default_checkpoint_dir(TRAIN, env) == default_checkpoint_dir([*TRAIN, "--more"], env)
    assert default_checkpoint_dir(TRAIN, env).name == "slurm-4711"
    assert default_checkpoint_dir(TRAIN, {"SLURM_JOB_ID": "4712"}) != default_checkpoint_dir(TRAIN, env)
    assert default_checkpoint_dir(TRAIN, {"PBS_JOBID": "12.server/x"}).name == "pbs-12.server_x"


def test_the_nodes_of_one_job_agree_on_the_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    node = ["torchrun", "--nnodes", "2", "--rdzv-endpoint", "h:29400", "train.py"]
    assert default_checkpoint_dir([*node[:1], "--node-rank", "0", *node[1:]], {}) == \
        default_checkpoint_dir([*node[:1], "--node_rank=1", *node[1:]], {})
    assert default_checkpoint_dir([*node, "--rdzv-id", "run7"], {}).name == "rdzv-run7"
    assert default_checkpoint_dir([*node, "--rdzv_id=run7"], {}).name == "rdzv-run7"


def test_only_old_partial_saves_are_removed(tmp_path):
    coords = ParallelCoordinates.from_layout(0, 2)
    dead = PendingSave(tmp_path, 5, coords)
    (dead.path / "state.pt").write_bytes(b"half")
    old = time.time() - 1000
    for p in [dead.path, dead.path / "state.pt"]:
        os.utime(p, (old, old))
    live = PendingSave(tmp_path, 6, ParallelCoordinates.from_layout(1, 2))
    (live.path / "state.pt").write_bytes(b"being written")
    store = DiskStore(tmp_path)
    assert store.remove_torn_saves(older_than=120) == [dead.path]
    assert not dead.path.exists() and live.path.exists()
