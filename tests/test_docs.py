"""The documentation's shape: a short README, nothing of the old README lost, no dead links.

The README used to hold everything (1,966 lines); it now holds what a user
needs first and links to ``docs/``, one page per reader.  These tests keep
that true: the README stays under 300 lines and names the test command CI
runs; every section of the old README still has a home in the README or in
``docs/`` (its headings, frozen below because CI's shallow clone cannot read
the old commit); every relative link in the README and in ``docs/`` reaches
an existing file, and every ``#anchor`` a heading of the page it points at
(GitHub's anchor rules); and the index ``docs/README.md`` links every page.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 300

# Every "## " and "### " heading of README.md at commit 2b5bd0b, the last
# single-page README, in order; a heading that occurred twice is listed twice.
OLD_README_HEADINGS = [
    "Quick start (fresh machine, CPU only)",
    "Using it",
    "What happens on a failure",
    "Data loading",
    "Multi-node jobs",
    "Sharded jobs",
    "Options",
    "Fault injection",
    "The recovery report",
    "Bad input",
    "Security",
    "Framework jobs (no code change)",
    "Hugging Face Trainer",
    "PyTorch Lightning",
    "For cluster admins",
    "`jit-run plan`: what do failures cost you?",
    "Usage",
    "Example",
    "The model (paper section 5)",
    "Monte Carlo",
    "Notes and differences from the paper",
    "The CPU device emulator",
    "A CUDA C++ training program on the emulator",
    "Passthrough interposition (CUDA runtime and NCCL)",
    "`jit-run doctor`: will jitckpt cover this program?",
    "What it does",
    "Example (a real run)",
    'What "covered" means',
    "Limits, stated plainly",
    "Transparent mode (`jit-run --transparent`)",
    "What happens on a failure",
    "What is refused, and why",
    "Environment",
    "Minibatch boundaries of Python programs",
    "Verified, and where",
    "Tests",
    "Benchmarks",
    "What is verified where",
    "Running on GPUs",
    "Known limitations",
    "Layout",
]

LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading text, the lines up to the next heading, code included) for every Markdown heading, in order."""
    sections: list[tuple[str, list[str]]] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if match:
            sections.append((match.group(1), []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a Markdown page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for heading, _ in _sections(page.read_text()):
        base = github_anchor(heading)
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def relative_links(page: Path) -> list[str]:
    """The targets of the page's inline links that point into the repository (not URLs, not inside code)."""
    prose = "\n".join(_prose_lines(page.read_text()))
    prose = re.sub(r"`[^`\n]*`", "", prose)  # a link inside inline code is an example, not a link
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; keep it under {README_MAX_LINES}, move the rest to docs/"


def test_the_readme_states_the_test_command_that_ci_runs():
    tests = dict(_sections(README.read_text())).get("Tests")
    assert tests is not None, "README.md has no '## Tests' section"
    assert any("scripts/test.sh" in line for line in tests), "README.md's Tests section does not name scripts/test.sh"
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text(), ".ci/run no longer runs the README's test command"


def test_every_section_of_the_old_readme_still_has_a_home():
    have: Counter[str] = Counter()
    empty = []
    for page in _pages():
        for heading, body in _sections(page.read_text()):
            have[heading] += 1
            if not any(line.strip() for line in body):
                empty.append(f"{page.relative_to(REPO)}: {heading}")
    lost = [h for h, n in Counter(OLD_README_HEADINGS).items() if have[h] < n]
    assert not lost, f"sections of the old README found neither in README.md nor in docs/*.md: {lost}"
    assert not empty, f"headings with nothing under them: {empty}"


def test_every_relative_link_reaches_a_file_and_every_anchor_a_heading():
    broken = []
    for page in _pages():
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not dest.is_relative_to(REPO) or not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_index_links_every_page_and_the_native_parts_readmes():
    index = DOCS / "README.md"
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in relative_links(index) if t.partition("#")[0]}
    pages = [p for p in DOCS.glob("*.md") if p != index]
    parts = [REPO / "interpose" / "README.md", REPO / "proxy_server" / "README.md", REPO / "emulator" / "README.md"]
    unlinked = [str(p.relative_to(REPO)) for p in [*pages, *parts] if p.resolve() not in linked]
    assert not unlinked, f"docs/README.md does not link: {unlinked}"
    assert any(t.startswith("docs/README.md") for t in relative_links(README)), "README.md does not link docs/README.md"


@pytest.mark.parametrize("heading, anchor", [
    ("`jit-run plan`: what do failures cost you?", "jit-run-plan-what-do-failures-cost-you"),
    ('What "covered" means', "what-covered-means"),
    ("Passthrough interposition (CUDA runtime and NCCL)", "passthrough-interposition-cuda-runtime-and-nccl"),
    ("What is verified here, and what only a GPU can confirm", "what-is-verified-here-and-what-only-a-gpu-can-confirm"),
    ("ABI facts (checked by `tests/test_emulator.py`)", "abi-facts-checked-by-teststest_emulatorpy"),
])
def test_anchors_follow_githubs_rules(heading, anchor):
    assert github_anchor(heading) == anchor


def test_the_link_check_catches_a_dead_file_and_a_dead_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Two words\n\n[ok](#two-words) [bad](#three-words) [gone](missing.md) "
                    "`[code](nowhere.md)` [web](https://example.com) [split\nover lines](#split)\n\n"
                    "```\n[fenced](nowhere.md)\n```\n")
    assert relative_links(page) == ["#two-words", "#three-words", "missing.md", "#split"]
    assert anchors(page) == {"title", "two-words"}
