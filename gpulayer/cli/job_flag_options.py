"""The job flags `submit` and `schedule create` share, declared once (typer Annotated types)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, Optional, TypeVar

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
NodesFlag = Annotated[
    Optional[int],
    typer.Option("--nodes", help="Run the command once on each of N nodes at once, as one gang."),
]
GpuModelFlag = Annotated[
    list[str],
    typer.Option("--gpu", help="GPU model, e.g. H100 or A100-80GB (repeatable: any of them fits)."),
]
GpuSlicesFlag = Annotated[
    bool,
    typer.Option(
        "--gpu-slices", help="A slice of one GPU (AWS g6f: 1/8 to 1/2 of an L4) counts as a GPU."
    ),
]
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


# (parameter, type with its option, default) of every shared job flag, in help order.
_JOB_FLAGS: tuple[tuple[str, Any, Any], ...] = (
    ("name", NameFlag, None),
    ("profile", ProfileFlag, None),
    ("target", TargetFlag, None),
    ("fallback", FallbackFlag, []),
    ("accelerator", AcceleratorFlag, None),
    ("gpus", GpusFlag, None),
    ("nodes", NodesFlag, None),
    ("gpu", GpuModelFlag, []),
    ("gpu_slices", GpuSlicesFlag, False),
    ("env", EnvFlag, []),
    ("secret", SecretFlag, []),
    ("input_", InputFlag, []),
    ("timeout", TimeoutFlag, None),
    ("max_hourly_cost", MaxHourlyCostFlag, None),
    ("worker_label", WorkerLabelFlag, []),
    ("label", LabelFlag, []),
    ("provider", ProviderFlag, []),
    ("region", RegionFlag, []),
)

C = TypeVar("C", bound=Callable[..., Any])


def with_job_flags(*, leave_out: frozenset[str] = frozenset()) -> Callable[[C], C]:
    """Give a command submit's job flags; it receives them as `job_flags: SubmitFlags`,
    with its own `argv` argument (the command after `--`) as `job_flags.argv`.

    The flags are added to the command's signature, which is what typer reads, so each
    command declares only its own options.
    """

    def decorate(command: C) -> C:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "job_flags"]
        added = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind
            )
            for name, kind, default in _JOB_FLAGS
            if name not in leave_out
        ]

        @functools.wraps(command)
        def wrapper(**values: Any) -> Any:
            flags = {
                name: default if name in leave_out else values.pop(name, default)
                for name, _, default in _JOB_FLAGS
            }
            argv = values.pop("argv", None)
            return command(**values, job_flags=submit_flags(argv, **flags))

        parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own + added]
        wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        return wrapper  # type: ignore[return-value]

    return decorate


def submit_flags(
    argv: Optional[list[str]],
    *,
    name: Optional[str],
    profile: Optional[str],
    target: Optional[str],
    fallback: list[str],
    accelerator: Optional[str],
    gpus: Optional[int],
    nodes: Optional[int],
    gpu: list[str],
    gpu_slices: bool,
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
        fallback=list(fallback),
        accelerator=accelerator,
        gpus=gpus,
        gpu_models=list(gpu),
        gpu_slices=gpu_slices,
        env=list(env),
        secrets=list(secret),
        inputs=list(input_),
        timeout=timeout,
        max_hourly_cost=max_hourly_cost,
        worker_labels=list(worker_label),
        labels=list(label),
        providers=list(provider),
        regions=list(region),
        nodes=nodes,
    )
