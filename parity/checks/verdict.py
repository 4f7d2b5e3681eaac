"""Whether a report passed: every case, every cross-framework row, every peer check."""

from __future__ import annotations


def report_passed(report: dict) -> bool:
    """True when every case passed and every cross-framework comparison is within tolerance.

    Args:
        report: a report object (``cases``, ``cross_framework``, optional ``peer`` and ``peer_step``), as
            :func:`parity.cases.suite.run_suite` returns it.
    """
    return (all(c["status"] == "pass" for c in report["cases"]) and all(x["ok"] for x in report["cross_framework"])
            and all(x["ok"] is not False for x in report.get("peer", []))
            and all(x["ok"] is not False for x in report.get("peer_step", []))
            and all(r["status"] == "pass" for m in (report.get("distributed") or {}).get("meshes", []) for r in m["rows"]))
