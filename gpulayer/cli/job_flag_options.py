"""The job flags `submit` and `schedule create` share, declared once (typer Annotated types)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from gpulayer.cli.spec_flags import SubmitFlags

NameFlag = Annotated[Optional[str], typer.Option("--name", help="Job name.")]
ProfileFlag = Annotated[
    Optional[str], typer.Option("--profile", help="Runtime profile, e.g. pytorch-cuda, mlx.")
]
TargetFlag = Annotated[Optional[str], typer.Option("--target", help="local, remote or cloud.")]
FallbackFlag = Annotated[
    list[str], typer.Option("--fallback", help="Fallback target (repeatable).")
]
AcceleratorFlag = Annotated[
    Optional[str], typer.Option("--accelerator", help="cpu, cuda, mps or rocm.")
]
GpusFlag = Annotated[Optional[int], typer.Option("--gpus", help="GPUs per node.")]
EnvFlag = Annotated[list[str], typer.Option("--env", help="K=V environment entry (repeatable).")]
SecretFlag = Annotated[
    list[str], typer.Option("--secret", help="NAME[=KEY] read from the worker's environment.")
]
InputFlag = Annotated[
    list[str], typer.Option("--input", help="ARTIFACT:PATH staged under $GPULAYER_INPUT_DIR.")
]
TimeoutFlag = Annotated[
    Optional[float], typer.Option("--timeout", help="Seconds before the job is ended.")
]
MaxHourlyCostFlag = Annotated[
    Optional[float], typer.Option("--max-hourly-cost", help="Cost cap per hour.")
]
WorkerLabelFlag = Annotated[
    list[str], typer.Option("--worker-label", help="K=V a worker must carry (repeatable).")
]
LabelFlag = Annotated[
    list[str], typer.Option("--label", help="K=V label of the job itself (repeatable).")
]
ProviderFlag = Annotated[
    list[str], typer.Option("--provider", help="Cloud provider to use (repeatable).")
]
RegionFlag = Annotated[list[str], typer.Option("--region", help="Region to use (repeatable).")]


def submit_flags(
    argv: Optional[list[str]],
    *,
    name: Optional[str],
    profile: Optional[str],
    target: Optional[str],
    fallback: list[str],
    accelerator: Optional[str],
    gpus: Optional[int],
    env: list[str],
    secret: list[str],
    input_: list[str],
    timeout: Optional[float],
    max_hourly_cost: Optional[float],
    worker_label: list[str],
    label: list[str],
    provider: list[str],
    region: list[str],
) -> SubmitFlags:
    return SubmitFlags(
        argv=list(argv or []),
        name=name,
        profile=profile,
        target=target,
        fallback=fallback,
        accelerator=accelerator,
        gpus=gpus,
        env=env,
        secrets=secret,
        inputs=input_,
        timeout=timeout,
        max_hourly_cost=max_hourly_cost,
        worker_labels=worker_label,
        labels=label,
        providers=provider,
        regions=region,
    )
