"""Output: the doctor's report as text for people, and the coverage list (``--transparent-list``).

JSON output is the reports' own ``to_json``; this module only lays out text.
The last line of ``render_text`` is always the verdict.
"""

from __future__ import annotations

import textwrap
from typing import Optional

from jitckpt.doctor.analysis import ROLE_LABELS, ROLE_TITLES, Report
from jitckpt.doctor.coverage import Coverage
from jitckpt.doctor.symbols import CATEGORY_TITLES, NCCL, RUNTIME

PROG = "jit-run doctor"


def _wrap(text: str, indent: str, hanging: Optional[str] = None, width: int = 100) -> str:
    """``text`` filled to ``width``; continuation lines line up after ``indent`` (or use ``hanging``)."""
    hanging = " " * len(indent) if hanging is None else hanging
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=hanging,
                         break_on_hyphens=False, break_long_words=False)


def render_text(report: Report, verbose: bool = False) -> str:
    """The human-readable report; its last line is the verdict."""
    out: list[str] = []
    root = report.root.obj
    out.append(f"{PROG}: {report.target}")
    out.append(f"  {report.kind}, {root.machine.replace('EM_', '').lower()}, {root.elf_class}-bit"
               + (f", soname {root.soname}" if root.soname else ""))
    if root.needed:
        out.append(_wrap("needs: " + " ".join(root.needed), "  ", "    "))
    if report.root.static_runtime:
        out.append(_wrap("carries a static copy of the CUDA runtime: " + "; ".join(report.root.static_runtime),
                         "  ", "    "))
    if report.root.static_nccl:
        out.append(_wrap("contains its own NCCL: " + "; ".join(report.root.static_nccl), "  ", "    "))
    out.append(_covers(report.coverage))
    if report.runtime_abi is not None:
        out.append(_wrap(report.runtime_abi.line, "  ", "    "))

    out.append("")
    ldp = ":".join(report.ld_library_path) if report.ld_library_path else "unset"
    out.append(f"Libraries, resolved like the dynamic loader (LD_LIBRARY_PATH {ldp}):")
    quiet: list[str] = []
    for o in report.objects[1:]:
        relevant = o.role or o.static_runtime or o.static_nccl or o.obj.imports
        if not relevant and not verbose:
            quiet.append(o.obj.name)
            continue
        what = ROLE_LABELS.get(o.role or "", "")
        if o.static_runtime:
            what = (what + "; " if what else "") + "carries a static copy of the CUDA runtime"
        if o.static_nccl:
            what = (what + "; " if what else "") + "contains its own NCCL"
        out.append(f"  {o.obj.name:<20} {o.obj.path}  [{o.found_via}]")
        if what:
            out.append(f"  {'':<20} {what}")
    if quiet:
        out.append(_wrap("no CUDA/NCCL use: " + ", ".join(quiet), "  ", "    "))
    for m in report.missing:
        out.append(f"  {m.needed:<20} NOT FOUND (needed by {m.needed_by})")
    if len(report.objects) == 1 and not report.missing:
        out.append("  (none)")

    provider = report.provider_summary
    if provider is not None:
        out.append("")
        out.append(f"{root.name} is {ROLE_TITLES[provider['role']]}: it defines rather than imports.")
        out.append(f"  defines {provider['defines']} {CATEGORY_TITLES[provider['category']]} functions, "
                   f"versions: {', '.join(provider['versions']) or '-'}")
        if provider["hidden_entry_points"]:
            out.append(_wrap("hidden entry points: " + " ".join(provider["hidden_entry_points"]), "  ", "    "))
        if provider["category"] in (RUNTIME, NCCL) and provider["covered"] is None:
            out.append(_wrap(f"jitckpt's coverage of them is unknown: {report.coverage.missing}", "  ", "    "))
        elif provider["category"] in (RUNTIME, NCCL):
            out.append(f"  jitckpt covers {provider['covered']} of them; not covered: {len(provider['not_covered'])}")
            if provider["not_covered"]:
                names = provider["not_covered"] if verbose else provider["not_covered"][:24]
                more = len(provider["not_covered"]) - len(names)
                out.append(_wrap(" ".join(names) + (f" ... and {more} more (-v or --json lists all)" if more else ""),
                                 "    "))

    out.append("")
    out.append(f"CUDA and NCCL imports ({len(report.imports)}):")
    if not report.imports:
        out.append("  (none)")
    importer = None
    width = max((len(i.symbol.display) for i in report.imports), default=0)
    width = min(max(width, 20), 60)
    for i in report.imports:
        if i.importer != importer:
            importer = i.importer
            out.append(f"  {importer}:")
        where = f"-> {i.bound_to}" if i.bound_to else "-> (unresolved)"
        line = f"    {i.symbol.display:<{width}}  {i.symbol.category:<12} {i.status:<16} {where}"
        if i.status not in ("covered",):
            line += f"  ({i.reason})"
        out.append(line)

    out.append("")
    out.append("Limits of runtime-level interposition:")
    for limit in report.limits:
        out.append(_wrap(limit.text, "  ", "      "))
        out.append(_wrap(("APPLIES HERE: " if limit.applies else "here: ") + limit.detail, "      ", "        "))
    if report.notes:
        out.append("")
        out.append("Notes:")
        for note in report.notes:
            out.append(_wrap(note, "  - "))

    if report.libraries:
        out.append("")
        out.append("NVIDIA libraries in transparent mode:")
        for row in report.libraries:
            use = "" if row["pytorch_common_path"] else "; not used by PyTorch's common training paths"
            out.append(f"  {row['library']:<11} {row['transparent']}{use}  ({row['file']})")
    out.append("")
    p, t = report.passthrough, report.transparent
    same = p.status == t.status and [str(r) for r in p.reasons] == [str(r) for r in t.reasons]
    for mode, verdict in (("passthrough", p), ("transparent", t)):
        if same and verdict is p:
            out.append(f"passthrough mode: {verdict.label}")
            continue
        out.append(f"{mode} mode: {verdict.label}" + ("  (both modes, because:)" if same else ""))
        for reason in verdict.reasons:
            out.append(_wrap(reason.short, "  - "))
            if reason.detail:
                out.append(_wrap(reason.detail, "    "))
        for caveat in verdict.caveats:
            out.append(_wrap("note: " + caveat, "  - "))
    out.append(report.verdict_line)
    return "\n".join(out) + "\n"


def _covers(coverage: Coverage) -> str:
    """The report's header line on coverage: how much jitckpt covers, or that it is unknown."""
    if not coverage.known:
        return _wrap(f"{coverage.missing}", "  ", "    ")
    line = (f"jitckpt covers {len(coverage.runtime)} CUDA runtime functions ({coverage.runtime_version}) and "
            f"{len(coverage.nccl)} NCCL functions")
    if coverage.refused:
        line += f" in transparent mode; libjitckpt_remote.so refuses {len(coverage.refused)} others by name"
    return _wrap(line + " (--transparent-list prints them)", "  ", "    ")


def render_coverage(coverage: Coverage) -> str:
    """The text of ``--transparent-list``: every function the interposer covers, or why that is unknown."""
    if not coverage.known:
        return _wrap(f"{PROG}: {coverage.missing}", "", "  ") + "\n"
    out = ["Functions jitckpt covers (transparent mode forwards them to the device proxy), from the "
           "interposer's generated coverage list:"]
    for source in coverage.sources:
        out.append(_wrap("from " + source, "  "))
    for title, table in ((f"CUDA runtime, version {coverage.runtime_version}", coverage.runtime),
                         ("NCCL, unversioned", coverage.nccl)):
        wrapped = sum(1 for name in table if coverage.passthrough.get(name) == "wrapped")
        out.append(f"{title} ({len(table)}; passthrough mode wraps {wrapped} of them and forwards the rest "
                   "unchanged):")
        out.append(_wrap(" ".join(sorted(table)), "  "))
    if coverage.remote:
        hows = {}
        for name in (*coverage.runtime, *coverage.nccl):
            how = coverage.remote.get(name, "?")
            hows[how] = hows.get(how, 0) + 1
        out.append(_wrap("How transparent mode's worker library (libjitckpt_remote.so) handles them: "
                         + ", ".join(f"{count} {how}" for how, count in sorted(hows.items()))
                         + " (marshalled: generated stub and proxy dispatch; hand-written: nvcc's hidden entry "
                           "points, launches, pinned host memory; in-process: pure functions run in the worker).", ""))
    if coverage.refused:
        out.append(_wrap(f"It refuses {len(coverage.refused)} other CUDA runtime and NCCL functions by name "
                         "(a program's call fails with cudaErrorNotSupported or ncclInvalidUsage, and one message); "
                         "`jit-run doctor PROGRAM` names those a program imports, with the reason.", ""))
    out.append("Never covered: the driver API (cu*), cuBLAS, cuDNN and other libraries with their own static "
               "runtime, and programs linked with -cudart static.")
    return "\n".join(out) + "\n"
