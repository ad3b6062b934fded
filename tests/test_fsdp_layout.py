"""A JIT save of an FSDP2 model while a pass holds it unsharded (issue 18, jitckpt/worker/fsdp_layout.py).

The strict matrix's fsdp-term-backward and fsdp-term-allreduce cases (tests/
test_strict_matrix.py, ``-m matrix``) are where it showed: before the freeze,
rank 1 died with SIGSEGV inside its save in 3 of 4 runs (FSDP2's pre-state-
dict hook freed full parameters that queued device work still wrote) and the
job started afresh; an earlier run committed a checkpoint with a full-shaped,
storage-less parameter that no restart could load.  This test shows the
mechanism itself, deterministically, with real FSDP2 in one process.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, job_env

PROBE = REPO / "tests" / "sharded_programs" / "fsdp_layout_probe.py"


def test_a_save_during_an_fsdp2_pass_sees_the_shards_and_freezes_every_later_swap():
    proc = subprocess.run([sys.executable, str(PROBE)], env=job_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DONE" in proc.stdout, output[-3000:]
    checks = dict(line.split()[1:3] for line in proc.stdout.splitlines() if line.startswith("CHECK "))
    assert checks == {
        "unsharded_before": "True",  # the situation: the root's parameters are the full tensors
        "groups_changed": "1",  # the root's group put back; model[0]'s was sharded already
        "state_dict_sharded": "True",  # what the user's save reads: the shards
        "full_storage_kept": "True",  # not freed under device work that may still write it
        "swap_parked": "True",  # a later unshard parks instead of changing what the save reads
        "still_sharded": "True",
    }, output[-3000:]
