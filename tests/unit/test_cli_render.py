"""Tables on an 80-column terminal keep ids and prices whole; amounts keep their digits."""

from __future__ import annotations

import pytest

from gpulayer.cli import render
from gpulayer.cli.numbers import amount_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (21.96, "21.96"),
        (3.0, "3.00"),
        (0.5264, "0.5264"),
        (1.23456, "1.2346"),
        (1e-05, "0.00001"),
        (0.00001234567, "0.0000123"),
        (0.001234, "0.00123"),
        (0.0, "0"),
        (None, "-"),
    ],
)
def test_amounts_keep_significant_digits(value: float | None, text: str) -> None:
    assert amount_text(value) == text


def test_an_amount_under_a_cent_is_never_zero() -> None:
    for exponent in range(3, 12):
        value = 1.5 * 10**-exponent
        assert float(amount_text(value)) == pytest.approx(value, rel=0.05)


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def _lines(captured: str) -> list[str]:
    lines = captured.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), captured
    return lines


@pytest.mark.usefixtures("narrow")
def test_offers_keep_types_and_prices_whole(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayer.cli.offers_view import offers_table

    def row(instance_type: str, price: float, zone: str) -> dict[str, object]:
        return {
            "provider": "aws",
            "enabled": True,
            "region": "ap-southeast-2",
            "zone": zone,
            "instance_type": instance_type,
            "gpu_count": 8,
            "gpu_name": "A100",
            "gpu_memory_gb": 80,
            "cpu_cores": 96,
            "memory_gb": 1152,
            "hourly_price": price,
            "currency": "USD",
            "spot": True,
        }

    listing = {
        "offers": [
            row("p4d.24xlarge", 21.957642, "ap-southeast-2a"),
            row("p5e.48xlarge", 1e-05, "ap-southeast-2b"),
        ],
        "total": 2,
    }
    offers_table(listing)
    out = "\n".join(_lines(capsys.readouterr().out))
    for expected in ("p4d.24xlarge", "p5e.48xlarge", "21.957642", "0.00001"):
        assert expected in out
    assert "…" not in out and "0.0000 " not in out


def _offer_row(provider: str, region: str, zone: str | None, spot: bool) -> dict[str, object]:
    return {
        "provider": provider,
        "enabled": True,
        "region": region,
        "zone": zone,
        "zones": [] if zone else ["us-east-1a", "us-east-1b", "us-east-1c"],
        "instance_type": "p4d.24xlarge" if provider == "aws" else "gpu-box-1",
        "gpu_count": 8,
        "gpu_name": "A100",
        "gpu_memory_gb": 80,
        "cpu_cores": 96,
        "memory_gb": 1152,
        "hourly_price": 21.96,
        "currency": "USD",
        "spot": spot,
    }


def _header(out: str) -> list[str]:
    return next(line for line in out.splitlines() if line.startswith("PROVIDER")).split()


@pytest.mark.usefixtures("narrow")
def test_offers_show_region_and_zone_apart(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayer.cli.offers_view import offers_table

    rows = [
        _offer_row("ssh", "on-prem", "gpu-box-1.lab.example", False),
        _offer_row("aws", "us-east-1", None, False),
    ]
    offers_table({"offers": rows, "total": 2})
    out = "\n".join(_lines(capsys.readouterr().out))
    header = _header(out)
    assert header[:3] == ["PROVIDER", "REGION", "ZONE"]
    # On-demand only: no SPOT column to leave empty.
    assert "SPOT" not in header
    ssh_line = next(line for line in out.splitlines() if line.startswith("ssh"))
    assert ssh_line.split()[1:3] == ["on-prem", "gpu-box-1.lab.example"]
    aws_line = next(line for line in out.splitlines() if line.startswith("aws"))
    # A catalog offer stands for its whole region: the zone is picked at launch.
    assert aws_line.split()[1:4] == ["us-east-1", "3", "zones"]


@pytest.mark.usefixtures("narrow")
def test_offers_have_a_spot_column_when_spot_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayer.cli.offers_view import offers_table

    rows = [_offer_row("aws", "us-east-1", "us-east-1a", True)]
    rows.append(_offer_row("aws", "us-east-1", "us-east-1a", False))
    offers_table({"offers": rows, "total": 2})
    out = "\n".join(_lines(capsys.readouterr().out))
    assert _header(out)[-1] == "SPOT"
    body = [line.split() for line in out.splitlines() if line.startswith("aws")]
    assert [line[-1] for line in body] == ["yes", "no"]


def test_offers_of_a_batch_queue_show_idle_nodes_and_time_limit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer.cli.offers_view import offers_table, time_limit_text

    monkeypatch.setenv("COLUMNS", "140")
    partition = {**_offer_row("slurm", "lab", "gpu", False), "instance_type": "4cpu-16gb-2xa100"}
    rows = [
        {**partition, "idle_nodes": 3, "time_limit_seconds": 129600},
        {**partition, "zone": "long", "idle_nodes": 0, "time_limit_seconds": None},
        _offer_row("aws", "us-east-1", "us-east-1a", False),
    ]
    offers_table({"offers": rows, "total": 3})
    out = capsys.readouterr().out
    assert _header(out)[-2:] == ["IDLE", "LIMIT"]
    body = {line.split()[2]: line.split() for line in out.splitlines()[1:] if line.strip()}
    assert body["gpu"][-2:] == ["3", "1d12h"]
    assert body["long"][-2:] == ["0", "none"]
    # A cloud offer's capacity is known only by launching.
    assert body["us-east-1a"][-2:] == ["-", "-"]
    assert (time_limit_text(1800), time_limit_text(90)) == ("30m", "1m30s")


def test_offers_of_clouds_alone_have_no_idle_or_limit_column(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpulayer.cli.offers_view import offers_table

    offers_table({"offers": [_offer_row("aws", "us-east-1", "us-east-1a", False)], "total": 1})
    header = _header(capsys.readouterr().out)
    assert "IDLE" not in header and "LIMIT" not in header


@pytest.mark.usefixtures("narrow")
def test_jobs_keep_ids_whole(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [
        {
            "id": f"j-q2cxv7hz3k9{i}",
            "name": "a-very-long-job-name-for-finetuning-a-large-model",
            "state": "provisioning",
            "reason": "unschedulable",
            "target": "cloud",
            "exit_code": None,
            "created_at": "2026-12-01T09:00:00.123+00:00",
        }
        for i in range(3)
    ]
    render.jobs_table(jobs)
    out = "\n".join(_lines(capsys.readouterr().out))
    for job in jobs:
        assert job["id"] in out
    assert "provisioning" in out and "2026-12-01 09:00:00" in out


@pytest.mark.usefixtures("narrow")
def test_cost_keeps_ids_and_amounts_whole(capsys: pytest.CaptureFixture[str]) -> None:
    ledger = {
        "instances": [
            {
                "job_id": "j-q2cxv7hz3k9a",
                "provider": "aws",
                "instance_id": "i-0123456789abcdef0",
                "request_id": "r-0123456789ab",
                "state": "terminated",
                "hourly_price": 32.7726,
                "launched_at": "2026-12-01T09:00:00",
                "ended_at": "2026-12-01T10:00:00",
                "cost": 0.000012,
                "currency": "USD",
            }
        ],
        "total": {"USD": 0.000012},
    }
    render.cost_table(ledger)
    out = "\n".join(_lines(capsys.readouterr().out))
    for expected in ("j-q2cxv7hz3k9a", "i-0123456789abcdef0", "32.7726", "0.000012 USD"):
        assert expected in out
    assert "total: 0.000012 USD" in out
