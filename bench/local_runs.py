"""Local-run speed, measured side by side in one run (no assertions; read the ratios).

    python bench/local_runs.py [--repeat N]

Rows: bare `python -c pass`; `gpulayer --help`; `gpulayer submit -- python -c pass` on a warm
local control plane; the cold start of the local control plane (spawn to first answer) and its
resident memory once the local worker is up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cold_start(env: dict[str, str], repeat: int) -> tuple[float, float]:
    from gpulayer.sdk.connection import local_control_plane
    from tests.support.daemon import stop_local_control_plane

    times, memory = [], []
    for _ in range(repeat):
        home = Path(tempfile.mkdtemp(prefix="gpulayer-bench-"))
        os.environ["GPULAYER_HOME"] = str(home)
        started = time.perf_counter()
        client = local_control_plane()
        times.append(time.perf_counter() - started)
        client.workers()  # the local worker has registered: the daemon is fully up
        memory.append(rss_mb(int(client.health()["pid"])))
        stop_local_control_plane(home)
        shutil.rmtree(home, ignore_errors=True)
    os.environ["GPULAYER_HOME"] = env["GPULAYER_HOME"]
    return statistics.median(times), max(memory)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    gpulayer = shutil.which("gpulayer")
    if gpulayer is None:
        sys.exit("install gpulayer first: pip install -e .")
    home = tempfile.mkdtemp(prefix="gpulayer-bench-")
    env = {**os.environ, "GPULAYER_HOME": home}
    python = sys.executable

    bare = timed([python, "-c", "pass"], env, args.repeat)
    helped = timed([gpulayer, "--help"], env, args.repeat)
    subprocess.run(
        [gpulayer, "submit", "--", "python", "-c", "pass"], env=env, check=True, capture_output=True
    )
    submitted = timed([gpulayer, "submit", "--", "python", "-c", "pass"], env, args.repeat)
    cold, memory = cold_start(env, max(3, args.repeat // 2))

    from tests.support.daemon import stop_local_control_plane

    stop_local_control_plane(Path(home))
    shutil.rmtree(home, ignore_errors=True)

    print(f"{'what':<46}{'median s':>10}{'vs bare python':>16}")
    print(f"{'python -c pass':<46}{bare:>10.3f}{'1.00x':>16}")
    print(
        f"{'gpulayer --help':<46}{helped:>10.3f}{helped / bare:>15.2f}x   (+{helped - bare:.3f} s)"
    )
    print(
        f"{'gpulayer submit -- python -c pass (warm)':<46}{submitted:>10.3f}"
        f"{submitted / bare:>15.2f}x   (+{submitted - bare:.3f} s)"
    )
    print(f"{'local control plane cold start':<46}{cold:>10.3f}{'':>16}   resident {memory:.0f} MB")


if __name__ == "__main__":
    main()
