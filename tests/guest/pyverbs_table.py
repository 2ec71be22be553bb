#!/usr/bin/env python3
"""Per-file table of rdma-core's pyverbs suite from unittest's verbose output, two columns side by side.

    pyverbs_table.py --rxe RESULT_LOG [--ours RESULT_LOG] --files test_device test_pd ...

Each log is what tests/guest/cellrun.sh writes for one cell per test file (tests/guest/pyverbs.sh): the
runner's output as ``@@OUT pyverbs:FILE| LINE`` lines, closed by ``@@CELL pyverbs:FILE ... rc=N ...
timeout=0|1``. Within a file's output, unittest -v (Python 3.11, ``TextTestResult``) prints for each test
``NAME (tests.FILE.CLASS.NAME)``, an optional docstring line, `` ... `` and one of ``ok``, ``skipped
'REASON'``, ``FAIL``, ``ERROR``, ``expected failure``, ``unexpected success`` (output that a test prints
itself may come between), then an ``ERROR: NAME (ID)`` / ``FAIL: NAME (ID)`` block per failed test whose
traceback's last line is the exception; that line is the reason given here.

Prints markdown: one row per file (tests / passed / skipped / failed per column; a failed count includes
errors), then the skip reasons with counts per column, then every test whose outcome differs between the
columns, with both reasons. Exits 1 when a file of a column timed out or gave no test at all (the cell's
timeout, unittest's "Ran N tests" missing), or when a test failed (FAIL, ERROR, unexpected success) in a
column that does not name it with --allow COLUMN:TEST (a known failure, its reason given by the caller).
"""

import argparse
import collections
import re
import sys

HEADER = re.compile(r"^(test\w*) \((tests\.(test_\w+)\.\w+\.\w+)\)(.*)$")
RESULT = re.compile(
    r"(?:^|\.\.\. )(ok|FAIL|ERROR|expected failure|unexpected success|skipped (['\"])(.*)\2)$")
BLOCK = re.compile(r"^(ERROR|FAIL): (test\w*) \((tests\.test_\w+\.\w+\.\w+)\)")
SEP = re.compile(r"^(=+|-+)$")


class FileResult:
    """One test file of one column: outcome and reason per test ID, the cell's rc and timeout."""

    def __init__(self):
        self.tests = collections.OrderedDict()  # id -> [outcome, reason]
        self.rc = None
        self.timed_out = False
        self.ran = None

    def counts(self):
        c = collections.Counter(o for o, _ in self.tests.values())
        return c["ok"], c["skipped"], c["FAIL"] + c["ERROR"] + c["unexpected success"]


def parse_output(lines):
    """Parses one file's unittest -v output into a FileResult (without rc)."""
    res = FileResult()
    current = None  # id of the test whose result line is still due
    block = None  # id of the ERROR / FAIL block being read
    block_last = ""
    for line in lines:
        m = BLOCK.match(line)
        if m:
            if block:
                res.tests[block][1] = block_last
            block, block_last = m.group(3), ""
            res.tests.setdefault(block, [m.group(1), ""])
            current = None
            continue
        if block:
            if SEP.match(line) or line.startswith("Ran "):
                if line.startswith("-") and not block_last:
                    continue  # the dashes under the block's title
                res.tests[block][1] = block_last
                block = None
            elif line.strip() and not line.startswith("Traceback") and not line.startswith("  "):
                block_last = line.strip()
            if block:
                continue
        m = re.match(r"^Ran (\d+) tests? in", line)
        if m:
            res.ran = int(m.group(1))
            continue
        m = HEADER.match(line)
        if m:
            current = m.group(2)
            res.tests[current] = ["?", ""]
            line = m.group(4)
        if current:
            r = RESULT.search(line)
            if r:
                outcome = r.group(1)
                reason = ""
                if outcome.startswith("skipped"):
                    outcome, reason = "skipped", r.group(3)
                res.tests[current] = [outcome, reason]
                current = None
    if block:
        res.tests[block][1] = block_last
    return res


def parse_log(path):
    """The cells of one result log: {file: FileResult}."""
    outs = collections.defaultdict(list)
    cells = {}
    with open(path, errors="replace") as fh:
        for raw in fh:
            line = raw.rstrip("\r\n")
            m = re.match(r"^@@OUT pyverbs:(\w+)\| ?(.*)$", line)
            if m:
                outs[m.group(1)].append(m.group(2))
                continue
            m = re.match(r"^@@CELL pyverbs:(\w+) .*\brc=(\d+)\b.*\btimeout=([01])", line)
            if m:
                cells[m.group(1)] = (int(m.group(2)), m.group(3) == "1")
    result = {}
    for name in set(outs) | set(cells):
        r = parse_output(outs.get(name, []))
        if name in cells:
            r.rc, r.timed_out = cells[name]
        result[name] = r
    return result


def short(test_id):
    return test_id.split(".")[-1]


def column(r):
    """'tests / passed / skipped / failed' of a FileResult, or why there is none."""
    if r is None:
        return "not run", "", "", ""
    ok, skip, fail = r.counts()
    n = len(r.tests)
    note = ""
    if r.timed_out:
        note = " (timed out)"
    elif r.ran is None:
        note = " (no summary)"
    return f"{n}{note}", str(ok), str(skip), str(fail)


def reasons(r):
    c = collections.Counter(why for o, why in r.tests.values() if o == "skipped")
    return "; ".join(f"{why} ({n})" for why, n in sorted(c.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rxe", required=True, help="result log of the guest (rxe0)")
    ap.add_argument("--ours", help="result log of the drop-in libraries on the host")
    ap.add_argument("--files", nargs="+", required=True, help="test files, in table order")
    ap.add_argument("--allow", action="append", default=[],
                    help="COLUMN:TEST, a known failure (rxe:NAME or ours:NAME, the test's method name)")
    a = ap.parse_args()
    rxe = parse_log(a.rxe)
    ours = parse_log(a.ours) if a.ours else None
    bad = []
    cols = [("rxe", rxe)] + ([("ours", ours)] if ours is not None else [])
    for name, col in cols:
        for f in a.files:
            r = col.get(f)
            if r is None or r.timed_out or not r.tests or r.ran is None:
                bad.append(f"{name}: {f}: " + ("no result" if r is None else
                                                "timed out" if r.timed_out else "no test ran"))
            if r is None:
                continue
            for tid, (o, _) in r.tests.items():
                if o in ("FAIL", "ERROR", "unexpected success", "?") and f"{name}:{short(tid)}" not in a.allow:
                    bad.append(f"{name}: {f}: {short(tid)} {'gave no result' if o == '?' else o} (not allowed)")

    head = "| file | rxe: tests | passed | skipped | failed |"
    rule = "|---|---|---|---|---|"
    if ours is not None:
        head += " ours: tests | passed | skipped | failed | tests whose outcome differs |"
        rule += "---|---|---|---|---|"
    print(head)
    print(rule)
    totals = collections.Counter()
    for f in a.files:
        row = [f, *column(rxe.get(f))]
        for k, (name, col) in enumerate(cols):
            r = col.get(f)
            if r is not None:
                ok, skip, fail = r.counts()
                totals[(name, "tests")] += len(r.tests)
                totals[(name, "ok")] += ok
                totals[(name, "skip")] += skip
                totals[(name, "fail")] += fail
        if ours is not None:
            row += list(column(ours.get(f)))
            row.append(str(len(differences(rxe.get(f), ours.get(f)))))
        print("| " + " | ".join(row) + " |")
    tot = ["total"]
    for name, _ in cols:
        tot += [str(totals[(name, k)]) for k in ("tests", "ok", "skip", "fail")]
    if ours is not None:
        tot.append(str(sum(len(differences(rxe.get(f), ours.get(f))) for f in a.files)))
    print("| " + " | ".join(tot) + " |")

    print()
    print("Skip reasons (count):")
    print()
    for f in a.files:
        for name, col in cols:
            r = col.get(f)
            if r is not None and reasons(r):
                print(f"- {f}, {name}: {reasons(r)}")
    print()
    print("Failures (the exception's last line):")
    print()
    for f in a.files:
        for name, col in cols:
            r = col.get(f)
            if r is None:
                continue
            for tid, (o, why) in r.tests.items():
                if o not in ("ok", "skipped", "expected failure"):
                    known = " (known: --allow)" if f"{name}:{short(tid)}" in a.allow else ""
                    print(f"- {f}, {name}: {short(tid)} {o}{known}: {why}")
    if ours is not None:
        print()
        print("Tests whose outcome differs (rxe | ours):")
        print()
        for f in a.files:
            for tid, ro, oo in differences(rxe.get(f), ours.get(f)):
                print(f"- {f}: {short(tid)}: rxe {fmt(ro)} | ours {fmt(oo)}")
    if bad:
        print()
        print("Not as expected: " + "; ".join(bad))
        return 1
    return 0


def fmt(o):
    if o is None:
        return "absent"
    return o[0] + (f" ({o[1]})" if o[1] else "")


def differences(a, b):
    """[(id, outcome in a, outcome in b)] for tests whose outcome differs (or that only one ran)."""
    ta = a.tests if a is not None else {}
    tb = b.tests if b is not None else {}
    out = []
    for tid in list(ta) + [t for t in tb if t not in ta]:
        oa, ob = ta.get(tid), tb.get(tid)
        if (oa[0] if oa else None) != (ob[0] if ob else None):
            out.append((tid, oa, ob))
    return out


if __name__ == "__main__":
    sys.exit(main())
