"""`jit-run doctor`'s command line: the argument parser and ``main(argv, stdout)``.

Exit status: 0 when the analysis ran (whatever the verdict, and also when
the coverage list is not built: the report then says the coverage is
unknown), 2 for bad usage or an input (program, library or ``--coverage``
file) that is missing, unreadable or not what it should be.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Optional, TextIO

from jitckpt.doctor.analysis import analyse
from jitckpt.doctor.coverage import COVERAGE_FILE, load_coverage
from jitckpt.doctor.errors import DoctorError
from jitckpt.doctor.render import PROG, render_coverage, render_text


def _locate(argument: str) -> str:
    """A path for the argument: as given if it exists, else looked up on PATH like a command."""
    if os.path.exists(argument) or "/" in argument:
        return argument
    found = shutil.which(argument)
    return found if found else argument


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `jit-run doctor`."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="List the CUDA runtime, driver, NCCL, cuBLAS and cuDNN symbols a program or library and its "
                    "dependencies import, say which ones jitckpt's interposer covers, and whether passthrough "
                    "(user-level) and transparent mode can work for it.",
        epilog="Exit status: 0 when the analysis ran (read the verdict; also when the coverage is unknown), "
               "2 for bad usage or input.",
    )
    parser.add_argument("target", nargs="?", metavar="PROGRAM_OR_LIBRARY",
                        help="an executable, shared library or Python extension module (a bare name is looked up on PATH)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--transparent-list", action="store_true",
                        help="print every CUDA runtime and NCCL function jitckpt covers (with PROGRAM: as well as the report)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list every library and every uncovered function, not just the interesting ones")
    parser.add_argument("--coverage", metavar="FILE",
                        help="read what jitckpt covers from FILE, a coverage.json as `make -C interpose` generates "
                             f"it, instead of the built one ({COVERAGE_FILE} of the interposer); without it and "
                             "without a built list, the report says the coverage is unknown")
    return parser


def main(argv: Optional[list[str]] = None, stdout: Optional[TextIO] = None) -> int:
    """Entry point of `jit-run doctor ARGS`; returns the exit status."""
    out = sys.stdout if stdout is None else stdout
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.target is None and not args.transparent_list:
        parser.error("a PROGRAM_OR_LIBRARY is required (or --transparent-list)")
    try:
        coverage = load_coverage(args.coverage)
    except DoctorError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.target is None:
        if args.json:
            out.write(json.dumps({"coverage": coverage.to_json(full=True)}, indent=2) + "\n")
        else:
            out.write(render_coverage(coverage))
        return 0
    try:
        report = analyse(_locate(args.target), coverage=coverage)
    except DoctorError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out.write(json.dumps(report.to_json(full_coverage=args.transparent_list), indent=2) + "\n")
    else:
        if args.transparent_list:
            out.write(render_coverage(coverage) + "\n")
        out.write(render_text(report, verbose=args.verbose))
    return 0

