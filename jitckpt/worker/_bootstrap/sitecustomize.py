"""Arms jitckpt in every worker jit-run launches, before the training script runs.

jit-run puts this directory first on the workers' PYTHONPATH.  Calling
``jitckpt.worker.arm()`` here installs the hooks and the watchdog before the
script calls init_process_group, even if the script imports jitckpt late (or,
for detection only, not at all).  In transparent mode (``jit-run
--transparent``: ``JITCKPT_TRANSPARENT=1``) it installs instead the minibatch
boundary hooks for the preloaded remote library
(``jitckpt.transparent.phases``), which do nothing without it.  Any other
sitecustomize on the path still runs.
"""

import os
import sys


def _arm() -> None:
    if os.environ.get("JITCKPT_ACTIVE") != "1":
        return
    try:
        import jitckpt.worker

        if jitckpt.worker.arm() is not None:
            import jitckpt.adapters  # framework adapters attach when a Trainer is imported

            jitckpt.adapters.install()
    except Exception as exc:  # never stop the user's script from starting
        print(f"[jitckpt] could not arm just-in-time checkpointing: {type(exc).__name__}: {exc}", file=sys.stderr)


def _transparent() -> None:
    if os.environ.get("JITCKPT_TRANSPARENT") != "1":
        return
    try:
        import jitckpt.transparent.phases

        jitckpt.transparent.phases.install_from_environment()
    except Exception as exc:  # never stop the user's script from starting
        print(f"[jitckpt] transparent mode: could not install the minibatch boundary hooks: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != here and os.path.isfile(candidate):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_jitckpt_chained_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_arm()
_transparent()
_chain()
