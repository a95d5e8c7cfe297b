"""A pytest plugin for card_session's pytest part: each failure's traceback is printed when the
test fails, not in the summary at the end. A part cut off at the budget never reaches that
summary: the lent H200's run (2026-11-28) named seven failures and showed none of their causes.

    python -m pytest -p failures_now ...    (with benchmarks/ on PYTHONPATH)
"""

from __future__ import annotations

import pytest

TAIL = 4000  # characters of each traceback: the assertion and its message sit at the end


class PrintFailures:
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            print(f"\n----- {report.nodeid} failed ({report.when}) -----\n{report.longreprtext[-TAIL:]}\n-----",
                  flush=True)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # under xdist the controller prints: a worker's stdout is not shown
        config.pluginmanager.register(PrintFailures(), "failures-now-printer")
