"""AWS's public bulk price list for EC2, one CSV per region, read without credentials.

``<base>/offers/v1.0/aws/AmazonEC2/current/<region>/index.csv`` starts with a few metadata
rows (format version, disclaimer, publication date, ...), then a header row starting with
"SKU", then one row per (product, term). The file is large (hundreds of MB for the big
regions), so it is read as a stream, row by row, keeping only plain on-demand Linux rows.
"""

from __future__ import annotations

import csv
import io
import re
import urllib.request
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from gpulayer.cloud import ProviderError, gpu_facts
from gpulayer_aws.errors import PROVIDER
from gpulayer_aws.families import gpu_model
from gpulayer_aws.shapes import Shape, slice_of_gpu

if TYPE_CHECKING:
    from gpulayer_aws.region_prices import RegionPrices

_WANTED = {
    "TermType": "OnDemand",
    "Product Family": "Compute Instance",
    "Operating System": "Linux",
    "Tenancy": "Shared",
    "Pre Installed S/W": "NA",
    "CapacityStatus": "Used",
    "License Model": "No License required",
}
_NUMBER = re.compile(r"[\d.,]+")
_TIMEOUT_SECONDS = 120


def price_list_url(base: str, region: str) -> str:
    return f"{base.rstrip('/')}/offers/v1.0/aws/AmazonEC2/current/{region}/index.csv"


def fetch_region_price_list(
    base: str, region: str, *, wait_seconds: float | None = None
) -> RegionPrices:
    """One region's prices. ``wait_seconds`` bounds each wait for the server (to connect, and
    for the next bytes), not the whole download, which is large."""
    url = price_list_url(base, region)
    limit = wait_seconds or _TIMEOUT_SECONDS
    try:
        with urllib.request.urlopen(url, timeout=limit) as response:
            text = io.TextIOWrapper(response, encoding="utf-8", newline="")
            return parse_price_list(text, region)
    except TimeoutError:
        raise ProviderError(
            f"no answer within {limit:g} s from the price list {url}", provider=PROVIDER
        ) from None
    except OSError as exc:
        if isinstance(getattr(exc, "reason", None), TimeoutError):  # urllib wraps a connect's
            raise ProviderError(
                f"no answer within {limit:g} s from the price list {url}", provider=PROVIDER
            ) from None
        raise ProviderError(f"price list {url}: {exc}", provider=PROVIDER) from None


def _number(text: str | None) -> float | None:
    match = _NUMBER.search(text or "")
    if not match:
        return None
    try:
        return float(match.group(0).replace(",", ""))
    except ValueError:
        return None


def _rows(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    reader = csv.reader(lines)
    for row in reader:
        if row and row[0] == "SKU":
            header = row
            break
    else:
        return
    for row in reader:
        yield dict(zip(header, row, strict=False))


def shape_from_row(row: dict[str, str]) -> Shape | None:
    name = row.get("Instance Type", "")
    vcpus = _number(row.get("vCPU"))
    memory = _number(row.get("Memory"))
    if not name or not vcpus or not memory:
        return None
    processor = row.get("Physical Processor", "").lower()
    arch = "aarch64" if "graviton" in processor or "arm" in processor else "x86_64"
    gpus = _number(row.get("GPU")) or 0
    # A slice of one GPU (g6f: "0.125") is one device holding that part of a GPU.
    part = slice_of_gpu(gpus)
    count = 1 if part else int(gpus)
    if not count:
        return Shape(name, int(vcpus), memory, arch)
    model = gpu_model(name)
    if model is None:
        return None  # a GPU family this plugin does not know the model of
    gpu_name, maker = model
    total = _number(row.get("GPU Memory"))
    facts = gpu_facts(gpu_name)
    whole = facts.memory_gb if facts else None
    per_gpu = round(total / count, 2) if total else whole
    if part and per_gpu and whole and per_gpu >= whole * 0.85:
        # The memory of the whole GPU the slice is part of: the slice holds its part of it.
        per_gpu = round(per_gpu * part, 2)
    return Shape(name, int(vcpus), memory, arch, gpu_name, maker, count, per_gpu, part)


def parse_price_list(lines: Iterable[str], region: str) -> RegionPrices:
    """On-demand USD per hour and hardware of each instance type in one region's CSV."""
    from gpulayer_aws.region_prices import RegionPrices

    found = RegionPrices()
    for row in _rows(lines):
        if any(row.get(k) != v for k, v in _WANTED.items()):
            continue
        if row.get("Region Code", region) != region or row.get("Currency", "USD") != "USD":
            continue
        if row.get("Unit", "").lower() not in ("hrs", "hours"):
            continue
        price = _number(row.get("PricePerUnit"))
        name = row.get("Instance Type", "")
        if not name or not price:
            continue
        found.on_demand[name] = min(price, found.on_demand.get(name, price))
        shape = shape_from_row(row)
        if shape is not None:
            found.hardware[name] = shape
    return found
