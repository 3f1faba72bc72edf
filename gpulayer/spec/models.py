"""The JobSpec contract (gpulayer.dev/v1alpha1) as pydantic v2 models.

Pure: no I/O. Rules that span several fields live in model validators, which raise
``ValueError("field: message")`` so that :mod:`gpulayer.spec.errors` can name the field path.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    field_validator,
    model_validator,
)

from gpulayer.spec.currency import CurrencyCode
from gpulayer.spec.patterns import ExactPattern
from gpulayer.spec.profiles import PROFILES

API_VERSION: Literal["gpulayer.dev/v1alpha1"] = "gpulayer.dev/v1alpha1"

Accelerator = Literal["cpu", "cuda", "mps", "rocm"]
GPU_ACCELERATORS: frozenset[str] = frozenset({"cuda", "mps", "rocm"})
Target = Literal["local", "remote", "cloud"]
Strategy = Literal["spread", "first_fit", "most_free_memory"]
OnUnschedulable = Literal["queue", "fail"]
ProfileName = Literal["pytorch-cpu", "pytorch-cuda", "pytorch-mps", "jax-cuda", "cupy-cuda", "mlx"]
RetryEvent = Literal["worker_lost", "preempted"]
"""worker_lost: the worker stopped heartbeating mid-attempt; preempted: the provider
reclaimed the (spot) instance the attempt ran on."""

OS_NAMES: frozenset[str] = frozenset({"linux", "darwin", "windows"})
CPU_ARCH_ALIASES: dict[str, str] = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
}

# Names torchrun / torch.distributed.elastic set for each process; a job may not override them.
TORCHRUN_ENV_NAMES: frozenset[str] = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
RESERVED_ENV_PREFIXES: tuple[str, ...] = ("GPULAYER_", "TORCHELASTIC_")
DEFAULT_GRACE_SECONDS = 30
MAX_GRACE_SECONDS = 3600
# Upper bounds of the numbers a spec holds (docs/jobspec-readings.md lists them). Each is far
# past any real job; they exist so a typo or an overflow (max_attempts: 10**30) is refused at
# submit, naming the field, instead of being stored and overflowing somewhere later.
MAX_TIMEOUT_SECONDS = 30 * 86400
MAX_ATTEMPTS = 100
MAX_NODES = 1024
MAX_PROCS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_GB = 1024
MAX_CPU_CORES = 4096
MAX_MEMORY_GB = 65536
MAX_DISK_GB = 1048576
MAX_HOURLY_COST = 1_000_000  # in the job's currency: wide enough for the smallest units (JPY)

# Exact patterns (gpulayer.spec.patterns): the whole value, ASCII only, and the published
# schema reads each the same way.
NAME = ExactPattern(r"[A-Za-z0-9_.-]{1,63}", "1 to 63 of letters, digits, '_', '.' and '-'")
ENV_NAME = ExactPattern(r"[A-Za-z_][A-Za-z0-9_]*", "a valid environment variable name")
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRYPOINT = ExactPattern(
    rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}(\.{_IDENTIFIER})*",
    "of the form module:function",
)
CAPABILITY = ExactPattern(r"[0-9]{1,2}\.[0-9]{1,2}", "of the form major.minor, e.g. '8.0'")
# A distribution name (PEP 508) optionally followed by dotted marker parts: torch, torch.cuda.
FRAMEWORK_KEY = ExactPattern(
    r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", "a package name or marker such as torch.cuda"
)
# A model name, optionally with a size ("A100-80GB"); models start with a letter, so a size
# alone ("80GB") is refused rather than matching nothing.
GPU_MODEL = ExactPattern(r"[A-Za-z][A-Za-z0-9 ._-]*", "a GPU model name such as A100-80GB")
# Printable ASCII without spaces after the scheme: a URL as pip and uv take it (an IRI's
# other characters are written percent-encoded).
INDEX_URL = ExactPattern(r"(https?|file)://[!-~]+", "an http(s):// or file:// URL")
# A Windows drive ("C:"): refused in relative paths whatever the Python version's pathlib
# reads as one (3.12 takes any character before the colon, 3.11 only ASCII letters).
_DRIVE = re.compile(r"[A-Za-z]:")
# What str.strip() removes (str.isspace), spelled out: Python's \s and ECMA-262's differ.
WHITESPACE_CLASS = (
    r"[\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
)
BLANK_PATH = ExactPattern(rf"{WHITESPACE_CLASS}*\.?{WHITESPACE_CLASS}*", "a path")
_SEPARATORS = re.compile(r"[/\\]")


class StrictModel(BaseModel):
    """Unknown fields are an error at every level of the contract."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=True)


def is_reserved_env_name(name: str) -> bool:
    return name in TORCHRUN_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def _check_entrypoint(value: str) -> str:
    return ENTRYPOINT.check(value)


def _check_specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(f"{value!r} is not a PEP 440 version specifier") from None
    return value


def _whole_number(value: Any) -> Any:
    # YAML and JSON writers print 2 as 2.0 at times; JSON Schema's integer accepts it too.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Integers as written: "2" and true are not integers (pydantic's lax mode converts them).
# Spelled Annotated[int, STRICT, Field(...), WHOLE] at each use: a nested Annotated alias
# would publish its bounds in the JSON Schema as "ge"/"le" instead of minimum/maximum.
STRICT = Strict()
WHOLE = BeforeValidator(_whole_number)
Number = Annotated[float, Strict()]
"""A number as written: ints are numbers, but "2" and true are not."""

Entrypoint = Annotated[str, AfterValidator(_check_entrypoint)]
VersionSpecifier = Annotated[str, AfterValidator(_check_specifier)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
GpuModelName = Annotated[str, Field(min_length=1, max_length=64), GPU_MODEL]


# --- workloads ------------------------------------------------------------------------------


class CommandWorkload(StrictModel):
    kind: Literal["command"]
    command: Annotated[list[str], Field(min_length=1)]
    source: str | None = None

    @field_validator("command")
    @classmethod
    def _program_named(cls, command: list[str]) -> list[str]:
        if not command[0]:
            raise ValueError("the program (first argument) may not be empty")
        return command


class FunctionWorkload(StrictModel):
    kind: Literal["function"]
    entrypoint: Entrypoint
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    source: str | None = None


class Rendezvous(StrictModel):
    port: Annotated[int, STRICT, Field(ge=1, le=65535), WHOLE] = 29500
    join_timeout_seconds: Annotated[Number, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = 300


class DistributedWorkload(StrictModel):
    kind: Literal["distributed"]
    entrypoint: NonEmptyStr | None = None
    args: list[str] = Field(default_factory=list)
    function: Entrypoint | None = None
    command: Annotated[list[str], Field(min_length=1)] | None = None
    """Any program, run once per node with the gang's GPULAYER_* variables (a project
    extension): a launcher script, DeepSpeed's or Accelerate's, MPI, JAX multi-host."""
    function_args: list[JsonValue] = Field(default_factory=list)
    function_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    source: str | None = None
    num_workers: Annotated[int, STRICT, Field(ge=1, le=MAX_NODES), WHOLE] = 1
    procs_per_worker: Annotated[int, STRICT, Field(ge=1, le=MAX_PROCS_PER_NODE), WHOLE] = 1
    comm_backend: Literal["gloo", "nccl"] | None = None
    """None until the JobSpec resolves it from the accelerator: nccl on cuda, else gloo."""
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)

    @model_validator(mode="after")
    def _one_program(self) -> DistributedWorkload:
        given = [self.entrypoint, self.function, self.command]
        if sum(program is not None for program in given) != 1:
            raise ValueError(
                "entrypoint: give exactly one of entrypoint (a script run by torchrun), "
                "function, and command (any program, run once per node)"
            )
        if self.function is None and (self.function_args or self.function_kwargs):
            raise ValueError("function_args: only allowed with function")
        if self.entrypoint is None and self.args:
            raise ValueError(
                "args: only allowed with entrypoint; use function_args for function, and put "
                "a command's arguments in command"
            )
        if self.command is not None and not self.command[0]:
            raise ValueError("command: the program (first argument) may not be empty")
        if self.entrypoint is not None:
            _check_relative_path(self.entrypoint, "entrypoint")
        return self

    @property
    def world_size(self) -> int:
        return self.num_workers * self.procs_per_worker


Workload = Annotated[
    Union[CommandWorkload, FunctionWorkload, DistributedWorkload], Field(discriminator="kind")
]


# --- resources ------------------------------------------------------------------------------


class ResourceRequest(StrictModel):
    profile: ProfileName | None = None
    accelerator: Accelerator = "cpu"
    gpu_count: Annotated[int, STRICT, Field(ge=0, le=MAX_GPUS_PER_NODE), WHOLE] | None = None
    gpu_models: list[GpuModelName] = Field(default_factory=list)
    """GPU models any of which fits ("H100", "A100-80GB": a size asks for that memory too),
    compared with what offers and workers report after one normalization; empty: any."""
    gpu_memory_gb: Annotated[Number, Field(gt=0, le=MAX_GPU_MEMORY_GB)] | None = None
    gpu_slices: Annotated[bool, STRICT] = False
    """A rented machine whose GPU is a slice of one physical GPU (AWS g6f: an eighth, a quarter
    or half of an L4, with that part's memory) counts as one GPU; false: whole GPUs only."""
    gpu_memory_kind: Literal["dedicated", "unified"] | None = None
    min_cuda_compute_capability: str | None = None
    cpu_cores: Annotated[Number, Field(gt=0, le=MAX_CPU_CORES)] = 1
    memory_gb: Annotated[Number, Field(gt=0, le=MAX_MEMORY_GB)] | None = None
    disk_gb: Annotated[Number, Field(gt=0, le=MAX_DISK_GB)] | None = None
    os: list[str] = Field(default_factory=list)
    cpu_arch: list[str] = Field(default_factory=list)
    frameworks: dict[str, VersionSpecifier] = Field(default_factory=dict)
    python: VersionSpecifier | None = None

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("profile"), str):
            return data
        profile = PROFILES.get(data["profile"])
        if profile is None:
            return data  # the Literal check names the unknown profile
        merged = dict(data)
        explicit = merged.get("accelerator")
        if explicit is None:
            merged["accelerator"] = profile.accelerator
        elif explicit != profile.accelerator:
            raise ValueError(
                f"accelerator: {explicit!r} does not match profile {profile.name!r}, "
                f"which needs {profile.accelerator!r}"
            )
        frameworks = merged.get("frameworks")
        if frameworks is None or isinstance(frameworks, dict):
            merged["frameworks"] = {**profile.frameworks, **(frameworks or {})}
        return merged

    @field_validator("min_cuda_compute_capability")
    @classmethod
    def _capability_form(cls, value: str | None) -> str | None:
        return value if value is None else CAPABILITY.check(value)

    @field_validator("os")
    @classmethod
    def _known_os(cls, values: list[str]) -> list[str]:
        normalized = [_ascii_lower(v) for v in values]
        unknown = [v for v in normalized if v not in OS_NAMES]
        if unknown:
            raise ValueError(f"unknown os {unknown[0]!r}; known: {', '.join(sorted(OS_NAMES))}")
        return list(dict.fromkeys(normalized))

    @field_validator("cpu_arch")
    @classmethod
    def _known_arch(cls, values: list[str]) -> list[str]:
        normalized = []
        for value in values:
            arch = CPU_ARCH_ALIASES.get(_ascii_lower(value))
            if arch is None:
                known = ", ".join(sorted(CPU_ARCH_ALIASES))
                raise ValueError(f"unknown cpu_arch {value!r}; known: {known}")
            normalized.append(arch)
        return list(dict.fromkeys(normalized))

    @field_validator("gpu_models")
    @classmethod
    def _distinct_models(cls, names: list[str]) -> list[str]:
        return list(dict.fromkeys(name.strip() for name in names))

    @field_validator("frameworks")
    @classmethod
    def _framework_names(cls, frameworks: dict[str, str]) -> dict[str, str]:
        for name in frameworks:
            FRAMEWORK_KEY.check(name)
        return frameworks

    @model_validator(mode="after")
    def _gpu_rules(self) -> ResourceRequest:
        if self.accelerator == "cpu":
            if self.gpu_count:
                raise ValueError("gpu_count: a cpu job cannot ask for GPUs; set an accelerator")
            for name in ("gpu_memory_gb", "gpu_memory_kind"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only meaningful with a GPU accelerator")
            if self.gpu_models:
                raise ValueError("gpu_models: only meaningful with a GPU accelerator")
            if self.gpu_slices:
                raise ValueError("gpu_slices: only meaningful with a GPU accelerator")
            self.gpu_count = 0
        else:
            if self.gpu_count is None:
                self.gpu_count = 1
            elif self.gpu_count == 0:
                raise ValueError(f"gpu_count: accelerator {self.accelerator} needs at least 1 GPU")
        if self.min_cuda_compute_capability is not None and self.accelerator != "cuda":
            raise ValueError("min_cuda_compute_capability: only meaningful with accelerator cuda")
        return self

    @property
    def gpus(self) -> int:
        return self.gpu_count or 0


# --- placement ------------------------------------------------------------------------------


class Provisioning(StrictModel):
    provider: NonEmptyStr | None = None
    release: NonEmptyStr | None = None
    """An image release from images/; None means the newest release for the provider."""
    provisioning_timeout_seconds: Annotated[Number, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = 600


class PlacementPolicy(StrictModel):
    target: Target = "local"
    fallback_targets: list[Target] = Field(default_factory=list)
    worker_ids: list[NonEmptyStr] = Field(default_factory=list)
    worker_labels: dict[str, str] = Field(default_factory=dict)
    providers: list[NonEmptyStr] = Field(default_factory=list)
    regions: list[NonEmptyStr] = Field(default_factory=list)
    strategy: Strategy = "spread"
    on_unschedulable: OnUnschedulable = "queue"
    max_hourly_cost: Annotated[Number, Field(ge=0, le=MAX_HOURLY_COST)] | None = None
    currency: CurrencyCode = "USD"
    provisioning: Provisioning | None = None

    @model_validator(mode="after")
    def _fallbacks_distinct(self) -> PlacementPolicy:
        chain = [self.target, *self.fallback_targets]
        if len(set(chain)) != len(chain):
            raise ValueError("fallback_targets: each target may appear once, target included")
        return self

    @property
    def targets(self) -> list[str]:
        return [self.target, *self.fallback_targets]


# --- the rest of the top level --------------------------------------------------------------


class SecretRef(StrictModel):
    name: str
    source: Literal["env"] = "env"
    key: NonEmptyStr | None = None
    """Where the worker reads the value (for source env: a variable of the worker's
    environment); defaults to name."""

    @field_validator("name")
    @classmethod
    def _env_name(cls, name: str) -> str:
        _check_env_name(name)
        return name

    @model_validator(mode="after")
    def _default_key(self) -> SecretRef:
        if self.key is None:
            self.key = self.name
        return self


class InputRef(StrictModel):
    artifact: NonEmptyStr
    path: str

    @field_validator("path")
    @classmethod
    def _inside_input_dir(cls, path: str) -> str:
        return _check_relative_path(path, None)


_DEFAULT_RETRY_ON: tuple[RetryEvent, ...] = ("worker_lost",)


class RetryPolicy(StrictModel):
    max_attempts: Annotated[int, STRICT, Field(ge=1, le=MAX_ATTEMPTS), WHOLE] = 1
    retry_on: list[RetryEvent] = Field(default_factory=lambda: list(_DEFAULT_RETRY_ON))


def check_name(name: str) -> str:
    """A job's (or a schedule's) name."""
    if not NAME.matches(name):
        raise ValueError(NAME.problem)
    return name


def _check_requirement(value: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(value)
    except InvalidRequirement as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid"
        raise ValueError(f"{value!r} is not a PEP 508 requirement: {first}") from None
    return value


def _check_setup_path(value: str) -> str:
    return _check_relative_path(value, None)


PipRequirement = Annotated[
    str, Field(min_length=1, max_length=1000), AfterValidator(_check_requirement)
]
IndexUrl = Annotated[str, Field(min_length=1, max_length=2000), INDEX_URL]
SETUP_TIMEOUT_SECONDS = 1800.0
MAX_SETUP_TIMEOUT_SECONDS = 86400.0


class Setup(StrictModel):
    """What a job needs installed before it runs (a project extension): ``commands`` run first,
    in order, then ``pip`` and ``requirements_file`` go into a virtual environment kept per
    exact request on each machine, whose interpreter runs the job."""

    pip: list[PipRequirement] = Field(default_factory=list)
    requirements_file: Annotated[str, AfterValidator(_check_setup_path)] | None = None
    commands: list[Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]] = (
        Field(default_factory=list)
    )
    index_url: IndexUrl | None = None
    extra_index_urls: list[IndexUrl] = Field(default_factory=list)
    find_links: list[Annotated[str, AfterValidator(_check_setup_path)]] = Field(
        default_factory=list
    )
    """Folders of the job's source holding wheels, for machines no package index reaches."""
    timeout_seconds: Annotated[Number, Field(gt=0, le=MAX_SETUP_TIMEOUT_SECONDS)] = (
        SETUP_TIMEOUT_SECONDS
    )

    @property
    def installs_packages(self) -> bool:
        return bool(self.pip or self.requirements_file)


class OutputsPolicy(StrictModel):
    """What besides $GPULAYER_OUTPUT_DIR is kept when a job ends (a project extension)."""

    paths: Annotated[
        list[Annotated[str, AfterValidator(_check_setup_path)]], Field(max_length=100)
    ] = Field(default_factory=list)
    """Globs relative to the job's working folder (``*.pt``, ``checkpoints/**``): files they
    match are kept as outputs at their paths, as if written under $GPULAYER_OUTPUT_DIR."""


class JobSpec(StrictModel):
    api_version: Literal["gpulayer.dev/v1alpha1"] = API_VERSION
    name: str = "job"
    workload: Workload
    resources: ResourceRequest = Field(default_factory=ResourceRequest)
    placement: PlacementPolicy = Field(default_factory=PlacementPolicy)
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[SecretRef] = Field(default_factory=list)
    inputs: list[InputRef] = Field(default_factory=list)
    timeout_seconds: Annotated[Number, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] | None = None
    # A project extension: between SIGTERM and SIGKILL when a cancel, a timeout or the
    # worker's own stop ends the job, so it can save what it has (its outputs upload after).
    grace_seconds: Annotated[Number, Field(ge=0, le=MAX_GRACE_SECONDS)] = DEFAULT_GRACE_SECONDS
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    labels: dict[str, str] = Field(default_factory=dict)
    setup: Setup | None = None
    outputs: OutputsPolicy | None = None
    # A project extension: ports the job listens on (TensorBoard, Jupyter), which
    # `gpulayer attach` forwards to the submitting machine.
    ports: Annotated[
        list[Annotated[int, STRICT, Field(ge=1, le=65535), WHOLE]], Field(max_length=16)
    ] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name_form(cls, name: str) -> str:
        return check_name(name)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            _check_env_name(name)
        return env

    @field_validator("secrets")
    @classmethod
    def _secret_names_unique(cls, secrets: list[SecretRef]) -> list[SecretRef]:
        names = [s.name for s in secrets]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise ValueError(f"secret {duplicate!r} is listed twice")
        return secrets

    @model_validator(mode="after")
    def _cross_field_rules(self) -> JobSpec:
        clash = sorted({s.name for s in self.secrets} & set(self.env))
        if clash:
            raise ValueError(f"env: {clash[0]!r} is also a secret; set it in one place only")
        paths = [i.path for i in self.inputs]
        duplicate = next((p for p in paths if paths.count(p) > 1), None)
        if duplicate:
            raise ValueError(f"inputs: path {duplicate!r} is used twice")
        workload = self.workload
        if isinstance(workload, DistributedWorkload):
            if self.retry.max_attempts > 1:
                raise ValueError("retry: distributed jobs take no retry (max_attempts must be 1)")
            self.retry = RetryPolicy(max_attempts=1, retry_on=[])
            if workload.comm_backend is None:
                workload.comm_backend = "nccl" if self.resources.accelerator == "cuda" else "gloo"
            if workload.comm_backend == "nccl" and self.resources.accelerator != "cuda":
                raise ValueError("workload.comm_backend: nccl needs accelerator cuda; use gloo")
        return self


# --- shared checks --------------------------------------------------------------------------


def _check_env_name(name: str) -> None:
    ENV_NAME.check(name)
    if is_reserved_env_name(name):
        raise ValueError(f"{name!r} is reserved (GPULAYER_*, TORCHELASTIC_* and torchrun's names)")


def _ascii_lower(value: str) -> str:
    # str.lower() folds some non-ASCII letters into ASCII ones (the Kelvin sign into "k"); the
    # names compared here are ASCII, and so is the schema's case-insensitive spelling of them.
    return value.lower() if value.isascii() else value


def _check_relative_path(path: str, field: str | None) -> str:
    """A path inside a folder, read alike on POSIX and Windows. Each rule is spelled out
    (rather than asked of pathlib, whose reading of drives changed between Python versions)
    so that the published schema (gpulayer.spec.schema.RELATIVE_PATH) says the same."""
    prefix = f"{field}: " if field else ""
    if BLANK_PATH.matches(path):
        raise ValueError(f"{prefix}path may not be empty")
    if "\x00" in path:
        raise ValueError(f"{prefix}path may not contain NUL")
    if path.startswith(("/", "\\")) or _DRIVE.match(path):
        raise ValueError(f"{prefix}{path!r} must be a relative path")
    if ".." in _SEPARATORS.split(path):
        raise ValueError(f"{prefix}{path!r} may not contain '..'")
    return path
