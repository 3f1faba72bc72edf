"""Items per second of ``fn.map`` through gpulayer's local control plane, beside a plain
``multiprocessing.Pool.map`` of the same function as the floor, side by side in one run.

    python bench/function_map.py [--items 1000] [--repeat 2] [--cpu-cores 1]

The function is trivial (it squares its item), so the rows measure what running an item
costs: for gpulayer, each item is a job of its own (its attempt, folder, logs, outcome) run
in a warm interpreter of the local worker; the first map also starts those interpreters.
``--cpu-cores`` is what each item asks for (the local worker runs as many at once as its
cores allow). Every result is checked. No assertions on speed: read the numbers.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Not this folder: its queue.py would shadow the standard library's, which Pool imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

MODULE = """
def square(x):
    return x * x
"""


def pool_rate(fn: object, items: int) -> float:
    started = time.perf_counter()
    with multiprocessing.Pool() as pool:
        out = pool.map(fn, range(items))  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    assert out == [i * i for i in range(items)]
    return items / elapsed


def gpulayer_rate(remote: object, items: int) -> float:
    started = time.perf_counter()
    out = remote.map(range(items), timeout=600)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    assert out == [i * i for i in range(items)], "a result is wrong"
    return items / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cpu-cores", type=float, default=1.0)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gpulayer-bench-map-"))
    source = home / "src"
    source.mkdir()
    (source / "bench_map_items.py").write_text(MODULE)
    os.environ["GPULAYER_HOME"] = str(home / "home")
    sys.path.insert(0, str(source))
    import gpulayer as gl
    from tests.support.daemon import stop_local_control_plane

    square = importlib.import_module("bench_map_items").square
    remote = gl.remote(cpu_cores=args.cpu_cores)(square)
    rows: list[tuple[str, float]] = []
    try:
        for run in range(args.repeat):
            rows.append((f"multiprocessing.Pool.map, run {run + 1}", pool_rate(square, args.items)))
            label = (
                "fn.map, run 1 (starts its interpreters)" if run == 0 else f"fn.map, run {run + 1}"
            )
            rows.append((label, gpulayer_rate(remote, args.items)))
    finally:
        stop_local_control_plane(home / "home")
        shutil.rmtree(home, ignore_errors=True)
    floor = max(rate for name, rate in rows if name.startswith("multiprocessing"))
    print(f"{args.items} items of a trivial function, {os.cpu_count()} cores")
    print(f"{'what':<44}{'items/s':>10}{'ms an item':>12}{'vs Pool.map':>18}")
    for name, rate in rows:
        versus = "floor" if rate == floor else f"{floor / rate:.1f}x slower"
        print(f"{name:<44}{rate:>10.1f}{1000 / rate:>12.3f}{versus:>18}")


if __name__ == "__main__":
    main()
