"""An idle warm interpreter never keeps a job from its GPUs: JobRuns of real processes share
one WarmPool, as a worker's attempts do, with the device variables a worker gives a job that
was handed GPUs (no GPU is needed: what holds a GPU is what the environment names)."""

from __future__ import annotations

from pathlib import Path

from gpulayer.spec import JobSpec
from gpulayer.worker.runner import JobRun, RunContext, RunOutcome
from gpulayer.worker.warm_pool import WarmPool, devices_of
from tests.support.procs import process_ended


def run(
    pool: WarmPool, root: Path, name: str, workload: dict[str, object], gpus: str
) -> RunOutcome:
    spec = JobSpec.model_validate({"workload": workload})
    ctx = RunContext(
        job_id=name,
        attempt=1,
        spec=spec,
        job_dir=root / name,
        source_dir=root / "src",
        extra_env={"CUDA_VISIBLE_DEVICES": gpus},
        warm=pool.entry(None),
    )
    return JobRun(ctx, on_log=lambda stream, text: None).run()


def test_devices_of_reads_what_a_job_is_given() -> None:
    assert devices_of({"CUDA_VISIBLE_DEVICES": ""}) == frozenset()
    assert devices_of({"CUDA_VISIBLE_DEVICES": "0,2"}) == {
        "CUDA_VISIBLE_DEVICES:0",
        "CUDA_VISIBLE_DEVICES:2",
    }


def test_a_job_given_an_idle_interpreters_gpu_ends_that_interpreter(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("import os\ndef pid(x):\n    return os.getpid()\n")
    pool = WarmPool(tmp_path / "work", None)
    function = {"kind": "function", "entrypoint": "model:pid", "args": [1]}
    try:
        first = run(pool, tmp_path, "a", function, "0")
        again = run(pool, tmp_path, "b", function, "0")
        assert first.state == again.state == "succeeded" and first.result == again.result
        warm = first.result
        assert isinstance(warm, int) and pool.pids() == {warm}
        # A job on another GPU leaves it be; one given its GPU ends it first.
        other = run(pool, tmp_path, "c", {"kind": "command", "command": ["true"]}, "1")
        assert other.state == "succeeded" and pool.pids() == {warm}
        same = run(pool, tmp_path, "d", {"kind": "command", "command": ["true"]}, "0")
        assert same.state == "succeeded"
        assert pool.pids() == set()
        assert process_ended(warm, 10)
    finally:
        pool.close()
