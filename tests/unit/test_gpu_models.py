"""GPU models by name: one normalization for offers, workers and what jobs ask for; memory at
the GPU's nominal size; exact GPU counts for rented machines, naming the nearest offer."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayer.cli.spec_flags import SubmitFlags, apply_flags
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.ranking import (
    describe_no_exact_fit,
    filter_offers,
    format_price,
    nearest_gpu_count,
)
from gpulayer.errors import SpecError
from gpulayer.hardware.gpus import (
    GpuName,
    closest_models,
    gpu_matches,
    is_known_model,
    nominal_memory_gb,
    parse_gpu_name,
)
from gpulayer.scheduler import reasons_never
from gpulayer.scheduler.index import WorkerIndex
from gpulayer.scheduler.outcome import Placement, Unplaced
from gpulayer.scheduler.placement import place
from gpulayer.spec.models import JobSpec
from gpulayer.spec.validate import validate_spec
from tests.unit.test_offers_ranking import offer as ranking_offer
from tests.unit.test_scheduler_builders import caps, job, worker


@pytest.mark.parametrize(
    ("name", "model", "memory"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", 80),
        ("NVIDIA A100-SXM4-40GB", "A100", 40),
        ("A100-80GB", "A100", 80),
        ("a100", "A100", None),
        ("NVIDIA H100 80GB HBM3", "H100", 80),
        ("Tesla V100-SXM2-16GB", "V100", 16),
        ("NVIDIA A10G", "A10G", None),
        ("A10", "A10", None),
        ("L40s", "L40S", None),
        ("NVIDIA L4", "L4", None),
        ("GB200", "GB200", None),
        ("B200", "B200", None),
        ("NVIDIA GeForce RTX 4090", "RTX4090", None),
    ],
)
def test_one_reading_of_gpu_names(name: str, model: str, memory: float | None) -> None:
    assert parse_gpu_name(name) == GpuName(model, memory)


@pytest.mark.parametrize(
    ("name", "reported", "nominal"),
    [
        ("NVIDIA A10G", 22.35, 24),  # what EC2 and nvidia-smi report for 24 GB
        ("NVIDIA L4", 22.35, 24),
        ("NVIDIA A100", 79.15, 80),
        ("NVIDIA A100", 39.39, 40),
        ("NVIDIA H200", 139.8, 141),
        ("NVIDIA A100-SXM4-80GB", 70.0, 80),  # the size in the name wins
        ("NVIDIA GH200 480GB", 95.6, 96),  # unless the model is not sold with it
        ("T4", None, 16),
        ("Some Future GPU", 31.5, 31.5),  # unknown: what it reports
    ],
)
def test_nominal_memory(name: str, reported: float | None, nominal: float) -> None:
    assert nominal_memory_gb(name, reported) == nominal


def test_a_size_in_the_request_asks_for_that_memory() -> None:
    eighty = parse_gpu_name("A100-80GB")
    assert gpu_matches(eighty, "NVIDIA A100-SXM4-80GB", 79.15)
    assert not gpu_matches(eighty, "NVIDIA A100-SXM4-40GB", 39.39)
    assert not gpu_matches(eighty, "NVIDIA H100", 79.6)
    assert gpu_matches(parse_gpu_name("A100"), "NVIDIA A100-SXM4-40GB", 39.39)


# --- the JobSpec field and the flag ----------------------------------------------------------


def _spec(**resources: Any) -> dict[str, Any]:
    return {"workload": {"kind": "command", "command": ["x"]}, "resources": resources}


def test_gpu_models_in_the_jobspec() -> None:
    spec = validate_spec(_spec(accelerator="cuda", gpu_models=["H100", "A100-80GB", "H100"]))
    assert spec.resources.gpu_models == ["H100", "A100-80GB"]
    with pytest.raises(SpecError, match="gpu_models: only meaningful with a GPU accelerator"):
        validate_spec(_spec(gpu_models=["H100"]))
    with pytest.raises(SpecError, match="gpu_models"):
        validate_spec(_spec(accelerator="cuda", gpu_models=["80GB"]))
    schema = JobSpec.model_json_schema()
    field = schema["$defs"]["ResourceRequest"]["properties"]["gpu_models"]
    assert field["type"] == "array" and field["items"]["pattern"].startswith("^(?:[A-Za-z]")


def test_gpu_flag_is_repeatable_and_implies_cuda() -> None:
    data = apply_flags(None, SubmitFlags(argv=["train"], gpu_models=["H100", "A100"]))
    assert data["resources"] == {"gpu_models": ["H100", "A100"], "accelerator": "cuda"}
    spec = validate_spec(data)
    assert (spec.resources.accelerator, spec.resources.gpus) == ("cuda", 1)
    mps = apply_flags(None, SubmitFlags(argv=["x"], accelerator="mps", gpu_models=["M2"]))
    assert mps["resources"]["accelerator"] == "mps"


def test_gpu_slices_flag_accepts_slices_and_implies_cuda() -> None:
    data = apply_flags(None, SubmitFlags(argv=["serve"], gpu_models=["L4"], gpu_slices=True))
    assert data["resources"] == {"gpu_models": ["L4"], "accelerator": "cuda", "gpu_slices": True}
    assert validate_spec(data).resources.gpu_slices is True
    alone = apply_flags(None, SubmitFlags(argv=["serve"], gpu_slices=True))
    assert alone["resources"] == {"gpu_slices": True, "accelerator": "cuda"}
    assert "gpu_slices" not in apply_flags(None, SubmitFlags(argv=["serve"])).get("resources", {})


# --- workers ---------------------------------------------------------------------------------


def test_scheduler_places_by_model_and_says_why_not() -> None:
    a10g = worker("a10g", caps(accelerator="cuda", gpus=(("NVIDIA A10G", 22.35, "8.6"),)))
    a100 = worker(
        "a100", caps(accelerator="cuda", gpus=(("NVIDIA A100-SXM4-80GB", 79.15, "8.0"),) * 2)
    )
    wants_a100 = job(accelerator="cuda", gpu_models=["A100"])
    wants_24 = job(accelerator="cuda", gpu_memory_gb=24, gpu_models=["a10g", "L4"])
    wants_h100 = job(accelerator="cuda", gpu_models=["H100"])
    for workers in (WorkerIndex([a10g, a100]), [a10g, a100]):
        assert place(wants_a100, workers) == Placement("a100", (0,))
        # 24 GB is met by the A10G's nominal size (it reports 22.35).
        assert place(wants_24, workers) == Placement("a10g", (0,))
        unplaced = place(wants_h100, workers)
        assert isinstance(unplaced, Unplaced) and unplaced.never
    reasons = reasons_never(wants_h100, a100)
    assert any("of model H100" in r and "NVIDIA A100-SXM4-80GB" in r for r in reasons)


# --- offers: exact counts, nominal memory, the nearest offer --------------------------------


def offer(instance_type: str, price: float | None, **changes: Any) -> Offer:
    """An A10G offer as EC2 describes it (22.35 GiB), changed as given."""
    return ranking_offer(instance_type, price, **{"gpu_memory_gb": 22.35, **changes})


OFFERS = [
    offer("g5.xlarge", 1.006),
    offer("g6.xlarge", 0.8048, gpu_name="L4"),
    offer("g6e.xlarge", 1.861, gpu_name="L40S", gpu_memory_gb=44.7),
    offer("p4d.24xlarge", 21.957642, gpu_name="A100", gpu_count=8, gpu_memory_gb=40),
    offer("p4d.24xlarge", 2.4655, gpu_name="A100", gpu_count=8, gpu_memory_gb=40, spot=True),
    offer("p4de.24xlarge", 27.44705, gpu_name="A100", gpu_count=8, gpu_memory_gb=80),
]


def _names(offers: list[Offer]) -> list[str]:
    return [o.instance_type for o in offers]


def test_24_gb_fits_a10g_and_l4_before_l40s() -> None:
    query = OfferQuery(accelerator="cuda", gpu_memory_gb=24)
    assert _names(filter_offers(OFFERS, query).offers) == ["g6.xlarge", "g5.xlarge", "g6e.xlarge"]


def test_rented_machines_fit_exactly() -> None:
    one_a100 = OfferQuery(accelerator="cuda", gpu_count=1, gpu_models=("A100",))
    result = filter_offers(OFFERS, one_a100)
    assert result.offers == []
    assert result.rejected["gpu_count: not exactly 1 GPUs"] == 3
    nearest = nearest_gpu_count(OFFERS, one_a100)
    assert nearest is not None and (nearest.instance_type, nearest.spot) == ("p4d.24xlarge", False)
    assert describe_no_exact_fit(one_a100, nearest, ["aws"]) == (
        "no aws offer has exactly 1 A100; p4d.24xlarge has 8 at 21.957642 USD/h"
    )
    eight = OfferQuery(accelerator="cuda", gpu_count=8, gpu_models=("A100-80GB",))
    assert _names(filter_offers(OFFERS, eight).offers) == ["p4de.24xlarge"]
    listing = OfferQuery(accelerator="cuda", gpu_models=("a100",), gpu_count_exact=False)
    assert set(_names(filter_offers(OFFERS, listing).offers)) == {"p4d.24xlarge", "p4de.24xlarge"}
    assert nearest_gpu_count(OFFERS, listing) is None


@pytest.mark.parametrize(
    ("price", "text"),
    [(21.957642, "21.957642"), (1e-05, "0.00001"), (0.526, "0.526"), (2.0, "2"), (0, "0")],
)
def test_prices_keep_significant_digits(price: float, text: str) -> None:
    assert format_price(price) == text


@pytest.mark.parametrize(
    ("name", "known"),
    [
        ("A100", True),
        ("nvidia a100-sxm4-80gb", True),
        ("H100 NVL", True),
        ("RTX PRO 6000", True),
        ("Tesla T4", True),
        ("A101", False),  # reads as an A10 by prefix, but more digits make another model
        ("H1000", False),
        ("FOO", False),
    ],
)
def test_known_models_are_the_tables_spelled_any_way(name: str, known: bool) -> None:
    assert is_known_model(name) is known


def test_closest_models_come_in_the_tables_spelling() -> None:
    assert closest_models("H10")[0] == "H100"
    assert closest_models("RTX 409")[0] == "RTX 4090"
    assert closest_models("zzzz") == []
