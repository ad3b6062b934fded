"""`jit-run`: the command-line entry point.

    jit-run [jit options] torchrun [torchrun options] train.py [args]   run a job
    jit-run --transparent torchrun [torchrun options] --no-python ./program [args]
                                                                        transparent mode (one device proxy per rank)
    jit-run plan ...                                                    failure-cost model
    jit-run doctor PROGRAM_OR_LIBRARY                                   CUDA/NCCL coverage
    jit-run emulator-path                                               CPU device emulator dir

Subcommands are dispatched here; running a job is `jitckpt.launch.launcher`
(`jitckpt.launch.transparent` with --transparent).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence


def _subcommands() -> dict[str, Callable[[list[str]], int]]:
    def plan(argv: list[str]) -> int:
        from jitckpt import plan as plan_module

        return plan_module.main(argv)

    def doctor(argv: list[str]) -> int:
        from jitckpt import doctor as doctor_module

        return doctor_module.main(argv)

    def emulator_path(argv: list[str]) -> int:
        from jitckpt.native import emulator

        return emulator.print_path(argv)

    return {"plan": plan, "doctor": doctor, "emulator-path": emulator_path}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `jit-run`; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    subcommands = _subcommands()
    if args and args[0] in subcommands:
        return subcommands[args[0]](args[1:])
    from jitckpt.launch import launcher

    return launcher.main(args)


if __name__ == "__main__":
    sys.exit(main())
