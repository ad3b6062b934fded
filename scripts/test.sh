#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it.  Extra arguments go to pytest
# (e.g. `scripts/test.sh -k recovery`, or `-m soak` for the long soak runs).
#
# Two passes (tests/conftest.py, "running the suite in parallel"):
#   1. every test not marked `serial`, on $JITCKPT_TEST_WORKERS pytest-xdist
#      workers (default: twice the cores plus one, at least 5: since workers are
#      forked from one template per job, a job's CPU is mostly its agent's and
#      its template's `import torch`, and much of a test is waiting -- hang
#      timeouts, step sleeps -- which the extra workers fill);
#   2. the `serial` tests (they time things or need the machine to themselves),
#      alone, one at a time.
# Both passes share one directory for what is computed once per run (the
# fault-free reference runs).  Every test has a timeout (pyproject.toml), so a
# hang fails that test, not the run.  At the end: the 20 slowest tests, the 10 costliest in CPU (all of them
# in the file JITCKPT_TEST_CPU_TABLE names, if set), and what the run cost in CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
cores=$(nproc 2>/dev/null || echo 2)
WORKERS=${JITCKPT_TEST_WORKERS:-$(( 2 * cores + 1 > 5 ? 2 * cores + 1 : 5 ))}

# The run's shared directory (a short path: the workers' tmp_path is under it, and some
# tests place Unix sockets there); kept when a test failed, for the post-mortem.
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/jt-XXXXXXXX")
export JITCKPT_TEST_SHARED=$run_dir

started=$SECONDS
times > "$run_dir/cpu-times"   # (in this shell: a subshell's `times` would count only its own children)
status=0
# exit status 5: nothing selected in this pass (e.g. -k that matches only serial tests)
"$PY" -m pytest -ra -n "$WORKERS" --dist loadgroup --serial-tests=exclude --basetemp="$run_dir/tmp" \
    --junitxml="$run_dir/parallel.xml" "$@" || status=$?
[ "$status" -eq 5 ] && status=0
serial_status=0
"$PY" -m pytest -ra -n 0 --serial-tests=only --junitxml="$run_dir/serial.xml" "$@" || serial_status=$?
[ "$serial_status" -eq 5 ] && serial_status=0
[ "$status" -eq 0 ] && status=$serial_status

"$PY" - "$run_dir"/parallel.xml "$run_dir"/serial.xml <<'EOF'
"""The 20 slowest tests of both passes (setup, call and teardown together), from pytest's JUnit XML."""
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

cases = []
for report in map(Path, sys.argv[1:]):
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            module, _, cls = case.get("classname", "").partition(".Test")
            where = module.replace(".", "/") + ".py" + (f"::Test{cls}" if cls else "")
            name = re.sub(r"@[^\]]*$", "", case.get("name", ""))  # without xdist's @group suffix
            cases.append((float(case.get("time", 0)), f"{where}::{name}"))
cases.sort(reverse=True)
print(f"\n==== the 20 slowest of {len(cases)} tests (seconds, setup + call + teardown) ====")
for seconds, name in cases[:20]:
    print(f"{seconds:8.1f}  {name}")

# CPU seconds per test (tests/conftest.py records them): on two cores the run is CPU-bound, so this is what
# each test costs the run.  A fault-free reference run counts for the first test that needed it.
per_test, per_file = [], {}
for table in sorted((Path(sys.argv[1]).parent / "cpu-per-test").glob("*.tsv")):
    for line in table.read_text().splitlines():
        cpu, _wall, nodeid = line.split("\t", 2)
        nodeid = re.sub(r"@[^\]]*$", "", nodeid)  # without xdist's @group suffix
        per_test.append((float(cpu), nodeid))
        per_file[nodeid.split("::")[0]] = per_file.get(nodeid.split("::")[0], 0.0) + float(cpu)
if per_test and os.environ.get("JITCKPT_TEST_CPU_TABLE"):  # every test's CPU seconds, most first, kept
    Path(os.environ["JITCKPT_TEST_CPU_TABLE"]).write_text("".join(f"{c:.1f}\t{n}\n" for c, n in sorted(per_test, reverse=True)))
if per_test:
    total = sum(cpu for cpu, _ in per_test)
    print(f"\n==== CPU: the 10 costliest tests and files of {total / 60:.1f} CPU-minutes in tests ====")
    for cpu, nodeid in sorted(per_test, reverse=True)[:10]:
        print(f"{cpu:8.1f}  {nodeid[:110]}")
    for path, cpu in sorted(per_file.items(), key=lambda kv: -kv[1])[:10]:
        print(f"{cpu:8.1f}  {path} ({100 * cpu / total:.0f}%)")
EOF
echo "tests: $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s, exit status $status"
# What the run cost in CPU (the children's user + system time, from bash's `times`): on a machine whose
# speed varies from day to day, the CPU minutes and the cores kept busy compare runs better than the minutes.
times >> "$run_dir/cpu-times"
"$PY" - "$(( SECONDS - started ))" "$(sed -n 2p "$run_dir/cpu-times")" "$(sed -n 4p "$run_dir/cpu-times")" "$(find "$run_dir" -path '*/reference-sha/*.json' | wc -l)" <<'EOF'
import re
import sys


def seconds(times_line: str) -> float:
    """User + system seconds of a line of bash's `times` ("0m1.5s 0m0.2s")."""
    return sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", times_line))


wall, references = int(sys.argv[1]), int(sys.argv[4])
cpu = seconds(sys.argv[3]) - seconds(sys.argv[2])
print(f"CPU: {cpu / 60:.1f} min (user + system), {cpu / max(wall, 1):.2f} cores busy on average; "
      f"{references} fault-free reference runs")
EOF
if [ "$status" -eq 0 ]; then
    rm -rf "$run_dir" || echo "warning: could not remove all of $run_dir (a test left a file it could not delete)"
else
    echo "the parallel pass's temporary files are kept in $run_dir/tmp"
fi
exit "$status"
