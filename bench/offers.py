"""Filtering and ranking many offers: how long one query takes over 100,000 synthetic offers,
and one query over AWS's offers alone beside the same query over AWS's and GCP's together
(GCP's from the catalog gpulayer-gcp ships, every region and spot included).

Run: python bench/offers.py [--offers N] [--repeat R]
Prints the median and best time per query; asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.ranking import BlockList, filter_offers, rank

# (gpu name, capability, memory GB) with the GPU counts its instance sizes come in.
_GPUS = [
    ("T4", "7.5", 16.0, (1, 4, 8)),
    ("A10G", "8.6", 22.4, (1, 4, 8)),
    ("L4", "8.9", 22.4, (1, 4, 8)),
    ("L40S", "8.9", 44.7, (1, 4, 8)),
    ("V100", "7.0", 16.0, (1, 4, 8)),
    ("A100", "8.0", 40.0, (8,)),
    ("A100", "8.0", 80.0, (8,)),
    ("H100", "9.0", 80.0, (1, 8)),
]
_PROVIDERS = ["aws", "gcp", "azure", "lambda"]
_REGIONS = [f"region-{i}" for i in range(20)]


def synthetic_offers(n: int, seed: int = 7) -> list[Offer]:
    rng = random.Random(seed)
    offers = []
    for i in range(n):
        provider = rng.choice(_PROVIDERS)
        region = rng.choice(_REGIONS)
        zone = f"{region}{'abcdef'[rng.randrange(6)]}"
        spot = rng.random() < 0.3
        if rng.random() < 0.25:
            cores = rng.choice([2, 4, 8, 16, 32, 64])
            cpu_price = round(cores * 0.05 * rng.uniform(0.8, 1.2), 4)
            offer = Offer(
                provider=provider,
                instance_type=f"cpu.{cores}x.{i % 97}",
                region=region,
                zone=zone,
                cpu_cores=cores,
                memory_gb=cores * 4,
                cpu_arch=rng.choice(["x86_64", "x86_64", "aarch64"]),
                hourly_price=cpu_price * (0.3 if spot else 1.0),
                spot=spot,
            )
        else:
            name, cc, memory, counts = rng.choice(_GPUS)
            count = rng.choice(counts)
            unit = {"7.0": 3.0, "7.5": 0.5, "8.0": 4.0, "8.6": 1.0, "8.9": 0.8, "9.0": 12.0}[cc]
            price: float | None = round(count * unit * rng.uniform(0.9, 1.3), 4)
            if rng.random() < 0.02:
                price = None
            offer = Offer(
                provider=provider,
                instance_type=f"{name.lower()}.{count}x.{i % 53}",
                region=region,
                zone=zone,
                accelerator="cuda",
                gpu_name=name,
                gpu_count=count,
                gpu_memory_gb=memory,
                gpu_memory_kind="dedicated",
                cuda_compute_capability=cc,
                cpu_cores=count * 8,
                memory_gb=count * 32,
                hourly_price=None if price is None else price * (0.3 if spot else 1.0),
                currency="USD" if rng.random() < 0.98 else "EUR",
                spot=spot,
            )
        offers.append(offer)
    return offers


def _queries() -> list[tuple[str, OfferQuery, dict[str, object]]]:
    blocked = BlockList()
    for r in _REGIONS[:5]:
        blocked.block("region", "aws", r, kind="quota")
    blocked.block("zone", "gcp", "region-7", "region-7a", kind="capacity")
    return [
        ("cpu job, 4 cores", OfferQuery(cpu_cores=4), {}),
        ("1 GPU, any", OfferQuery(accelerator="cuda"), {}),
        (
            "1 GPU >= 24 GB, cc >= 8.0, cap 5/h",
            OfferQuery(accelerator="cuda", gpu_memory_gb=24, min_cuda_compute_capability="8.0"),
            {"max_hourly_cost": 5.0},
        ),
        (
            "8 GPUs A100, 2 providers, 10 regions, blocks",
            OfferQuery(accelerator="cuda", gpu_count=8, gpu_name="a100"),
            {"providers": ["aws", "gcp"], "regions": _REGIONS[:10], "blocked": blocked},
        ),
        (
            "1 GPU, cap 0.01/h (nothing fits)",
            OfferQuery(accelerator="cuda"),
            {"max_hourly_cost": 0.01},
        ),
    ]


def _median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--offers", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    started = time.perf_counter()
    offers = synthetic_offers(args.offers)
    print(f"{len(offers):,} synthetic offers built in {time.perf_counter() - started:.2f} s")

    rank_times = []
    for _ in range(3):
        t0 = time.perf_counter()
        ranked = rank(offers)
        rank_times.append(time.perf_counter() - t0)
    print(f"rank once into RankedOffers: median {_median_ms(rank_times)} ms")
    print()
    print("per query, wall ms (median of repeats) and process CPU ms (median)")
    print(f"{'query':46} {'fit':>7} {'wall':>7} {'cpu':>7}")
    for label, query, limits in _queries():
        wall, cpu = [], []
        fitting = 0
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            result = filter_offers(ranked, query, **limits)  # type: ignore[arg-type]
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
            fitting = len(result.offers)
        print(f"{label:46} {fitting:>7,} {_median_ms(wall):>7} {_median_ms(cpu):>7}")
    compare_with_gcp(offers, args.repeat)


def _gcp_catalog_offers() -> tuple[list[Offer], float, float]:
    """GCP's catalog offers (cpu and cuda), the seconds the first build took (catalog file
    read included) and the median of rebuilding them."""
    from gpulayer_gcp import GcpProvider

    queries = [OfferQuery(), OfferQuery(accelerator="cuda", gpu_count_exact=False)]
    provider = GcpProvider({})
    t0 = time.perf_counter()
    offers = [o for q in queries for o in provider.catalog_offers(q, everywhere=True)]
    first = time.perf_counter() - t0
    again = []
    for _ in range(5):
        t0 = time.perf_counter()
        [o for q in queries for o in provider.catalog_offers(q, everywhere=True)]
        again.append(time.perf_counter() - t0)
    return offers, first, statistics.median(again)


def compare_with_gcp(offers: list[Offer], repeat: int) -> None:
    try:
        gcp, first, again = _gcp_catalog_offers()
    except ImportError:
        print("gpulayer-gcp is not installed: no GCP comparison")
        return
    aws = [o for o in offers if o.provider == "aws"]
    print()
    print(
        f"GCP catalog: {len(gcp):,} offers built in {first * 1000:.1f} ms the first time, "
        f"{again * 1000:.1f} ms again (median)"
    )
    query = OfferQuery(accelerator="cuda", gpu_memory_gb=24, min_cuda_compute_capability="8.0")
    label = "1 GPU >= 24 GB, cc >= 8.0, cap 5/h"
    rows = []
    for name, pool in (("aws alone", aws), ("aws + gcp", aws + gcp)):
        # Process CPU time: other work on a loaded machine inflates wall time, not this.
        rank_times, cpu = [], []
        fitting = 0
        for _ in range(repeat):
            t0 = time.process_time()
            ranked = rank(pool)
            rank_times.append(time.process_time() - t0)
            t0 = time.process_time()
            result = filter_offers(ranked, query, max_hourly_cost=5.0)
            cpu.append(time.process_time() - t0)
            fitting = len(result.offers)
        cheapest = result.offers[0].label if result.offers else "-"
        rows.append(
            (
                name,
                len(pool),
                fitting,
                statistics.median(rank_times),
                statistics.median(cpu),
                cheapest,
            )
        )
    print(f"query: {label}")
    print(
        f"{'offers':12} {'count':>8} {'fit':>7} {'rank cpu ms':>12} {'query cpu ms':>13}  cheapest"
    )
    for name, count, fitting, ranked_s, cpu_s, cheapest in rows:
        print(
            f"{name:12} {count:>8,} {fitting:>7,} {ranked_s * 1000:>12.1f} "
            f"{cpu_s * 1000:>13.1f}  {cheapest}"
        )
    base, both = rows[0], rows[1]
    print(
        f"ratio (aws + gcp) / aws alone: rank {both[3] / base[3]:.2f}x, "
        f"query {both[4] / base[4]:.2f}x for {both[1] / base[1]:.2f}x the offers"
    )


if __name__ == "__main__":
    main()
