"""A schedule with a budget, renting the ssh provider's priced hosts (real sshd hosts, machines
of their own): it runs while the period's spend plus the next run's worst case fits, then skips
ticks with budget_exhausted, and never spends more than its budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.e2e_cloud.journey import ledger, wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.support.cli import run_cli

# 36 per hour is 0.01 a second. A run's worst case covers its timeout and the provisioning
# window before it (billed from launch): 36 x (30 + 60) / 3600 = 0.9.
PRICE = 36.0
TIMEOUT = 30.0
PROVISIONING = 60.0
WORST = PRICE * (TIMEOUT + PROVISIONING) / 3600
MAX_COST = 1.0


def cli_json(args: list[str]) -> Any:
    result = run_cli(args, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_budget_skips_ticks_once_the_worst_case_would_not_fit(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    write_providers(cloud_home, [host_entry(host, "priced", PRICE, tmp_path / "installs")])
    document = {
        "name": "budgeted",
        "cron": "*/2 * * * * *",
        "job": {
            "workload": {"kind": "command", "command": ["true"]},
            "placement": {
                "target": "cloud",
                "max_hourly_cost": PRICE,
                "provisioning": {"provisioning_timeout_seconds": PROVISIONING},
            },
            "timeout_seconds": TIMEOUT,
        },
        "budget": {"max_cost": MAX_COST, "currency": "USD", "period": "day"},
    }
    path = tmp_path / "budgeted.yaml"
    path.write_text(yaml.safe_dump(document))
    created = cli_json(["schedule", "apply", "-f", str(path), "--json"])
    budget = created["schedule"]["budget"]
    assert budget["next_run_worst_case"] == round(WORST, 6)
    try:
        runs = wait_until(
            lambda: (
                (found := cli_json(["schedule", "runs", "budgeted", "--limit", "500", "--json"]))
                and any(r["outcome"] == "budget_exhausted" for r in found)
                and found
            ),
            timeout=240,
            what="a tick skipped with budget_exhausted",
        )
    finally:
        cli_json(["schedule", "pause", "budgeted", "--json"])
    made = [r for r in runs if r["outcome"] == "created"]
    assert made, runs
    exhausted = [r for r in runs if r["outcome"] == "budget_exhausted"]
    assert f"the next run may cost {WORST:.4f}" in exhausted[0]["message"]
    for run in made:
        wait_until(
            lambda run=run: all(
                i["state"] == "terminated" for i in ledger(run["job_id"])["instances"]
            ),
            what=f"teardown of {run['job_id']}",
        )
    spent = sum(ledger(r["job_id"])["total"].get("USD", 0.0) for r in made)
    assert 0 < spent <= MAX_COST
    shown = cli_json(["schedule", "show", "budgeted", "--json"])["budget"]
    assert abs(shown["spent"] - spent) < 1e-3
    assert abs(shown["left"] - (MAX_COST - shown["spent"])) < 1e-6
    assert shown["spent"] + shown["next_run_worst_case"] > MAX_COST
    text = run_cli(["schedule", "show", "budgeted"]).stdout
    assert "spent" in text and "left" in text
    cli_json(["schedule", "delete", "budgeted", "--json"])
