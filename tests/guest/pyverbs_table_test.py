#!/usr/bin/env python3
"""Tests of tests/guest/pyverbs_table.py's parser of unittest -v output (python3 tests/guest/pyverbs_table_test.py).

The fixture has the shapes Python 3.11's TextTestResult writes: a result on the test's own line, a docstring
line carrying the result, output the test printed between the name and the result, a skip reason in
quotes, ERROR / FAIL blocks with tracebacks, and a cell that timed out before its last result.
"""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyverbs_table as pt  # noqa: E402

LOG = """\
@@OUT pyverbs:test_a| test_one (tests.test_a.ATest.test_one) ... ok
@@OUT pyverbs:test_a| test_two (tests.test_a.ATest.test_two)
@@OUT pyverbs:test_a| Test the second thing ... skipped "Create MW is not supported (it's absent)"
@@OUT pyverbs:test_a| test_three (tests.test_a.ATest.test_three) ... printed by the test
@@OUT pyverbs:test_a| more output
@@OUT pyverbs:test_a| ERROR
@@OUT pyverbs:test_a| test_four (tests.test_a.ATest.test_four) ... FAIL
@@OUT pyverbs:test_a| test_five (tests.test_a.ATest.test_five) ... skipped 'Device memory is not supported'
@@OUT pyverbs:test_a| 
@@OUT pyverbs:test_a| ======================================================================
@@OUT pyverbs:test_a| ERROR: test_three (tests.test_a.ATest.test_three)
@@OUT pyverbs:test_a| ----------------------------------------------------------------------
@@OUT pyverbs:test_a| Traceback (most recent call last):
@@OUT pyverbs:test_a|   File "/pyverbs/tests/test_a.py", line 9, in test_three
@@OUT pyverbs:test_a|     raise PyverbsRDMAError('x')
@@OUT pyverbs:test_a| pyverbs.pyverbs_error.PyverbsRDMAError: Completion status is local QP operation error
@@OUT pyverbs:test_a| 
@@OUT pyverbs:test_a| ======================================================================
@@OUT pyverbs:test_a| FAIL: test_four (tests.test_a.ATest.test_four)
@@OUT pyverbs:test_a| ----------------------------------------------------------------------
@@OUT pyverbs:test_a| Traceback (most recent call last):
@@OUT pyverbs:test_a|   File "/pyverbs/tests/test_a.py", line 12, in test_four
@@OUT pyverbs:test_a| AssertionError: 1 != 2
@@OUT pyverbs:test_a| 
@@OUT pyverbs:test_a| ----------------------------------------------------------------------
@@OUT pyverbs:test_a| Ran 5 tests in 0.100s
@@OUT pyverbs:test_a| 
@@OUT pyverbs:test_a| FAILED (failures=1, errors=1, skipped=2)
@@CELL pyverbs:test_a role=server rc=1 secs=1.0 tries=1 timeout=0
@@OUT pyverbs:test_b| test_slow (tests.test_b.BTest.test_slow) ... 
@@CELL pyverbs:test_b role=server rc=124 secs=9.0 tries=1 timeout=1
"""


class ParserTest(unittest.TestCase):
    def setUp(self):
        fd, self.path = tempfile.mkstemp(suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write(LOG)

    def tearDown(self):
        os.unlink(self.path)

    def test_outcomes_and_reasons(self):
        r = pt.parse_log(self.path)["test_a"]
        got = {pt.short(t): tuple(v) for t, v in r.tests.items()}
        self.assertEqual(got, {
            "test_one": ("ok", ""),
            "test_two": ("skipped", "Create MW is not supported (it's absent)"),
            "test_three": ("ERROR", "pyverbs.pyverbs_error.PyverbsRDMAError: "
                                    "Completion status is local QP operation error"),
            "test_four": ("FAIL", "AssertionError: 1 != 2"),
            "test_five": ("skipped", "Device memory is not supported"),
        })
        self.assertEqual(r.counts(), (1, 2, 2))
        self.assertEqual((r.ran, r.rc, r.timed_out), (5, 1, False))

    def test_timed_out_cell(self):
        r = pt.parse_log(self.path)["test_b"]
        self.assertTrue(r.timed_out)
        self.assertIsNone(r.ran)
        self.assertEqual([v[0] for v in r.tests.values()], ["?"])

    def run_main(self, *extra):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyverbs_table.py")
        return subprocess.run([sys.executable, script, "--rxe", self.path, "--ours", self.path,
                               "--files", "test_a", *extra], capture_output=True, text=True, timeout=60)

    def test_failures_fail_unless_allowed(self):
        p = self.run_main()
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("test_three ERROR (not allowed)", p.stdout)
        self.assertIn("| test_a | 5 | 1 | 2 | 2 | 5 | 1 | 2 | 2 | 0 |", p.stdout)
        p = self.run_main(*[f"--allow={c}:test_{t}" for c in ("rxe", "ours") for t in ("three", "four")])
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertIn("test_four FAIL (known: --allow): AssertionError: 1 != 2", p.stdout)

    def test_timed_out_file_fails(self):
        p = self.run_main("--allow=rxe:test_three", "--allow=rxe:test_four", "--allow=ours:test_three",
                          "--allow=ours:test_four")
        self.assertEqual(p.returncode, 0, p.stdout)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyverbs_table.py")
        p = subprocess.run([sys.executable, script, "--rxe", self.path, "--files", "test_b"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("rxe: test_b: timed out", p.stdout)


if __name__ == "__main__":
    unittest.main()
