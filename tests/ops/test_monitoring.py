"""The shipped alert rules and Grafana dashboard (infra/monitoring/): `promtool test rules`
passes, and every kwal metric they use is one kwal exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.metrics import Metrics

MONITORING = Path(__file__).resolve().parents[2] / "infra" / "monitoring"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: it comes from Debian's prometheus package "
            "(`apt-get install -y prometheus`, which scripts/setup runs when it is missing)"
        )
    return path


def exported_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
    return names


def test_promtool_checks_and_tests_the_alert_rules() -> None:
    tool = promtool()
    check = subprocess.run(
        [tool, "check", "rules", "kwal-alerts.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [tool, "test", "rules", "kwal-alerts.test.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout + test.stderr


def test_rules_and_dashboard_use_only_exported_metrics() -> None:
    exported = exported_names()
    rules = (MONITORING / "kwal-alerts.yml").read_text()
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    used = set(re.findall(r"\bkwal_[a-z_]+", rules + "\n".join(exprs)))
    assert used, "no kwal metric found in the rules or the dashboard"
    assert used <= exported, f"not exported by infra.metrics: {sorted(used - exported)}"
    alerts = set(re.findall(r"alert: (\w+)", rules))
    assert {"KwalTnDown", "KwalCheckpointStalled", "KwalRetentionHeadroomLow", "KwalCnLagHigh"} <= alerts
