"""The capability probe: parsing of recorded vendor-tool output, metadata scanning, markers,
and the real probe on this machine."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpulayer.hardware.probe_parsing import (
    NVIDIA_FIELDS_LEGACY,
    compute_capability_for_name,
    parse_cuda_version,
    parse_meminfo,
    parse_nvidia_query,
)
from gpulayer.spec.models import CPU_ARCH_ALIASES
from gpulayer.worker.probe import (
    collect_capabilities,
    cpu_arch,
    disk_free_gb,
    framework_key,
    is_marker_key,
    probe_capabilities,
)
from gpulayer.worker.probe_frameworks import (
    MARKER_RULES,
    canonical_name,
    framework_versions,
    installed_distributions,
    markers_for,
)
from gpulayer.worker.probe_gpu import (
    NOT_FOUND,
    TIMED_OUT,
    CommandResult,
    parse_rocm_smi,
    probe_nvidia,
    probe_rocm,
    run_command,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia_smi"


def recorded(box: str, name: str) -> str:
    return (FIXTURES / box / f"{name}.out").read_text()


# --- Replaying recorded nvidia-smi through a real process --------------------------------------

_REPLAY_SCRIPT = """\
#!/bin/sh
dir='{dir}'
case "$1" in
  "") name=banner ;;
  --query-gpu=*compute_cap*) name=query ;;
  --query-gpu=*) name=query_legacy ;;
  *) echo "no recording for: $*" >&2; exit 64 ;;
esac
echo "$name" >> '{log}'
[ -f "$dir/$name.out" ] || {{ echo "no recording for: $*" >&2; exit 64; }}
cat "$dir/$name.out"
if [ -f "$dir/$name.rc" ]; then exit "$(cat "$dir/$name.rc")"; fi
"""


class Replay:
    """Stands in for a machine's nvidia-smi: an executable that prints what that machine's
    nvidia-smi printed. Every other tool is absent."""

    def __init__(self, box: str, tmp_path: Path) -> None:
        self.log = tmp_path / f"{box}.calls"
        self.script = tmp_path / f"nvidia-smi-{box}"
        self.script.write_text(_REPLAY_SCRIPT.format(dir=FIXTURES / box, log=self.log))
        self.script.chmod(self.script.stat().st_mode | stat.S_IXUSR)

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        if argv[0] != "nvidia-smi":
            return CommandResult(NOT_FOUND, "", f"{argv[0]}: not installed here")
        return run_command([str(self.script), *argv[1:]])

    @property
    def calls(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


def nothing_installed(argv: Sequence[str]) -> CommandResult:
    return CommandResult(NOT_FOUND, "", f"{argv[0]}: not installed here")


# --- A site-packages directory with real metadata on disk -------------------------------------


def make_dist(
    site: Path, name: str, version: str, requires: Sequence[str] = (), dirname: str | None = None
) -> Path:
    # Installers escape "-" in both parts, as wheel file names do.
    default = f"{name.replace('-', '_')}-{version.replace('-', '_')}.dist-info"
    folder = site / (dirname or default)
    folder.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (folder / "METADATA").write_text("\n".join(lines) + "\n\nLong description.\n")
    return folder


# --- nvidia-smi parsing -----------------------------------------------------------------------


def test_a100_box_parses_each_device() -> None:
    gpus, driver = parse_nvidia_query(recorded("a100_2x", "query"))
    assert driver == "535.129.03"
    assert [g.index for g in gpus] == [0, 1]
    assert {g.name for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert all(g.memory_gb == 80.0 for g in gpus)
    assert all(g.memory_kind == "dedicated" for g in gpus)
    assert all(g.compute_capability == "8.0" for g in gpus)
    assert gpus[0].uuid == "GPU-4e7b4f2a-6f9c-3b1e-8d2a-1c5e9f0a7b31"
    assert gpus[0].uuid != gpus[1].uuid


def test_h100_box_reports_eight_devices_in_gib() -> None:
    gpus, driver = parse_nvidia_query(recorded("h100_8x", "query"))
    assert driver == "550.54.15"
    assert [g.index for g in gpus] == list(range(8))
    assert all(g.name == "NVIDIA H100 80GB HBM3" for g in gpus)
    # 81559 MiB is what the board exposes: a little under 80 GiB.
    assert all(g.memory_gb == round(81559 / 1024, 2) for g in gpus)
    assert all(g.compute_capability == "9.0" for g in gpus)
    assert len({g.uuid for g in gpus}) == 8


@pytest.mark.parametrize(
    ("box", "cuda"), [("a100_2x", "12.2"), ("h100_8x", "12.4"), ("v100_4x_r470", "11.4")]
)
def test_cuda_version_comes_from_the_banner(box: str, cuda: str) -> None:
    assert parse_cuda_version(recorded(box, "banner")) == cuda


def test_cuda_version_also_reads_the_version_flag_layout() -> None:
    text = "NVIDIA-SMI version  : 570.86.15\nDRIVER version      : 570.86.15\nCUDA Version : 12.8\n"
    assert parse_cuda_version(text) == "12.8"


def test_driver_failure_banner_has_no_cuda_version() -> None:
    assert parse_cuda_version(recorded("no_driver", "banner")) is None


def test_rows_a_broken_device_prints_are_skipped() -> None:
    text = (
        "0, NVIDIA A10G, 23028, 8.6, GPU-aaaa, 535.104.05\n"
        "Unable to determine the device handle for GPU0000:00:1F.0: Unknown Error\n"
        "2, NVIDIA A10G, 23028, [N/A], [N/A], 535.104.05\n"
    )
    gpus, _ = parse_nvidia_query(text)
    assert [g.index for g in gpus] == [0, 2]
    # A value the driver cannot give falls back to what is known of the product.
    assert gpus[1].compute_capability == "8.6"
    assert gpus[1].uuid is None


def test_integrated_gpu_takes_the_host_memory() -> None:
    text = "0, NVIDIA GB10, [N/A], 12.1, GPU-5f1e, 580.95.05\n"
    (gpu,), _ = parse_nvidia_query(text, host_memory_gb=119.7)
    assert gpu.memory_kind == "unified"
    assert gpu.memory_gb == 119.7
    assert gpu.compute_capability == "12.1"


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("NVIDIA A100-SXM4-80GB", "8.0"),
        ("NVIDIA A100-PCIE-40GB", "8.0"),
        ("NVIDIA H100 80GB HBM3", "9.0"),
        ("NVIDIA H100 PCIe", "9.0"),
        ("NVIDIA H200", "9.0"),
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA A10G", "8.6"),
        ("NVIDIA A10", "8.6"),
        ("NVIDIA L4", "8.9"),
        ("NVIDIA L40S", "8.9"),
        ("Tesla T4", "7.5"),
        ("Tesla V100-SXM2-16GB", "7.0"),
        ("Tesla K80", "3.7"),
        ("NVIDIA B200", "10.0"),
        ("NVIDIA GeForce RTX 4090", "8.9"),
        ("NVIDIA GeForce RTX 3090", "8.6"),
        ("NVIDIA RTX A6000", "8.6"),
        ("NVIDIA RTX 6000 Ada Generation", "8.9"),
        ("Quadro RTX 8000", "7.5"),
        ("Some Future Accelerator", None),
    ],
)
def test_compute_capability_by_product_name(name: str, capability: str | None) -> None:
    assert compute_capability_for_name(name) == capability


def test_old_driver_is_asked_again_without_compute_cap(tmp_path: Path) -> None:
    replay = Replay("v100_4x_r470", tmp_path)
    report = probe_nvidia(replay)
    assert replay.calls == ["query", "query_legacy", "banner"]
    assert [g.index for g in report.gpus] == [0, 1, 2, 3]
    assert all(g.name == "Tesla V100-SXM2-16GB" for g in report.gpus)
    assert all(g.compute_capability == "7.0" for g in report.gpus)
    assert all(g.memory_gb == round(16160 / 1024, 2) for g in report.gpus)
    assert report.driver_version == "470.182.03"
    assert report.cuda_version == "11.4"


def test_legacy_rows_parse_with_the_legacy_fields() -> None:
    gpus, _ = parse_nvidia_query(recorded("v100_4x_r470", "query_legacy"), NVIDIA_FIELDS_LEGACY)
    assert len(gpus) == 4
    assert gpus[3].uuid == "GPU-8a3f1c2e-0d4b-11eb-9c6e-3b2f5a7d8e04"


def test_driver_not_loaded_means_no_gpus(tmp_path: Path) -> None:
    replay = Replay("no_driver", tmp_path)
    report = probe_nvidia(replay)
    assert report.gpus == []
    assert report.driver_version is None
    assert replay.calls == ["query"]


def test_missing_tool_is_reported_not_raised() -> None:
    result = run_command(["/nonexistent/bin/nvidia-smi"])
    assert result.returncode == NOT_FOUND
    assert probe_nvidia(lambda argv: run_command(["/nonexistent/bin/nvidia-smi"])).gpus == []


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _running_after_kill(pid: int) -> bool:
    # SIGKILL is delivered asynchronously: give the kernel a moment to end the process.
    for _ in range(100):
        if not _running(pid):
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process state from /proc")
def test_hanging_tool_is_cut_off_with_its_children(tmp_path: Path) -> None:
    # Like a wrapper script: the shell starts the real work as a child. The child lets go of
    # the pipes so that, were only the shell ended, the call would return and leave it running.
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f"#!/bin/sh\nsleep 60 >/dev/null 2>&1 &\necho $! > '{pidfile}'\nwait\necho late\n"
    )
    script.chmod(0o755)

    def runner(argv: Sequence[str]) -> CommandResult:
        return run_command([str(script), *argv[1:]], timeout=1.0)

    assert runner(["nvidia-smi"]).returncode == TIMED_OUT
    child = int(pidfile.read_text())
    survived = _running_after_kill(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived
    assert probe_nvidia(runner).gpus == []


# --- rocm-smi parsing -------------------------------------------------------------------------

ROCM_TWO_MI300X = json.dumps(
    {
        "card0": {
            "Card Series": "AMD Instinct MI300X",
            "Card Model": "0x74a1",
            "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
            "Card SKU": "M3000100",
            "Unique ID": "0x8b5a2e1f4c3d2a10",
            "VRAM Total Memory (B)": "205822885888",
            "VRAM Total Used Memory (B)": "297312256",
        },
        "card1": {
            "Card Series": "AMD Instinct MI300X",
            "Card Model": "0x74a1",
            "Unique ID": "0x8b5a2e1f4c3d2a11",
            "VRAM Total Memory (B)": "205822885888",
            "VRAM Total Used Memory (B)": "297312256",
        },
        "system": {"Driver version": "6.8.5"},
    },
    indent=4,
)


def test_rocm_smi_json_parses_each_card() -> None:
    report = parse_rocm_smi(ROCM_TWO_MI300X)
    assert [g.index for g in report.gpus] == [0, 1]
    assert all(g.name == "AMD Instinct MI300X" for g in report.gpus)
    assert all(g.memory_gb == round(205822885888 / 1024**3, 2) for g in report.gpus)
    assert all(g.memory_kind == "dedicated" and g.compute_capability is None for g in report.gpus)
    assert report.gpus[1].uuid == "0x8b5a2e1f4c3d2a11"
    assert report.driver_version == "6.8.5"


def test_rocm_smi_older_key_spelling_and_banner_before_json() -> None:
    text = "WARNING: unlocked\n" + json.dumps(
        {"card3": {"Card series": "Instinct MI210", "VRAM Total Memory (B)": "68702699520"}}
    )
    (gpu,) = parse_rocm_smi(text).gpus
    assert (gpu.index, gpu.name, gpu.memory_gb) == (3, "Instinct MI210", 63.98)


@pytest.mark.parametrize("text", ["", "ERROR: No AMD GPUs specified", "{not json", "[1, 2]"])
def test_rocm_smi_without_cards_means_no_gpus(text: str) -> None:
    assert parse_rocm_smi(text).gpus == []


def test_rocm_probe_ignores_a_failing_tool() -> None:
    assert probe_rocm(lambda argv: CommandResult(1, ROCM_TWO_MI300X, "")).gpus == []
    assert len(probe_rocm(lambda argv: CommandResult(0, ROCM_TWO_MI300X, "")).gpus) == 2


# --- Installed distributions ------------------------------------------------------------------


def test_distribution_names_are_pep503_normalized(tmp_path: Path) -> None:
    make_dist(tmp_path, "PyYAML", "6.0.1")
    make_dist(tmp_path, "zope.interface", "6.0")
    make_dist(tmp_path, "typing_extensions", "4.12.2")
    egg = tmp_path / "Legacy_Pkg.egg-info"  # a develop install: version only in PKG-INFO
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: Legacy_Pkg\nVersion: 0.3\n")
    (tmp_path / "oldstyle-1.2-py3.11.egg-info").write_text("Name: oldstyle\nVersion: 1.2\n")
    make_dist(tmp_path, "hand-made", "2.0", dirname="hand-made-2.0.dist-info")
    (tmp_path / "not_metadata").mkdir()
    found = framework_versions(installed_distributions([str(tmp_path)]))
    assert found == {
        "pyyaml": "6.0.1",
        "zope-interface": "6.0",
        "typing-extensions": "4.12.2",
        "legacy-pkg": "0.3",
        "oldstyle": "1.2",
        "hand-made": "2.0",
    }


def test_requirements_are_read_past_a_folded_license(tmp_path: Path) -> None:
    folder = tmp_path / "torch-2.5.1.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: torch\n"
        "Version: 2.5.1\n"
        "License: BSD-3-Clause\n"
        "        \n"
        "        Copyright (c) the authors\n"
        "Requires-Dist: filelock\n"
        'Requires-Dist: nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux"\n'
        "\n"
        "Requires-Dist: not-a-header-but-prose\n"
    )
    torch = installed_distributions([str(tmp_path)])["torch"]
    assert torch.requirement_names() == ["filelock", "nvidia-cuda-runtime-cu12"]


def test_first_directory_on_the_path_wins(tmp_path: Path) -> None:
    make_dist(tmp_path / "first", "numpy", "2.1.0")
    make_dist(tmp_path / "second", "numpy", "1.26.4")
    found = installed_distributions(
        [str(tmp_path / "missing"), str(tmp_path / "first"), str(tmp_path / "second")]
    )
    assert found["numpy"].version == "2.1.0"


def test_scan_of_this_interpreter_agrees_with_importlib_metadata() -> None:
    expected: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            expected.setdefault(canonical_name(name), dist.version)
    assert {n: d.version for n, d in installed_distributions().items()} == expected


def test_cupy_is_reported_under_its_import_name(tmp_path: Path) -> None:
    make_dist(tmp_path, "cupy-cuda12x", "13.3.0", dirname="cupy_cuda12x-13.3.0.dist-info")
    versions = framework_versions(installed_distributions([str(tmp_path)]))
    assert versions["cupy"] == "13.3.0"
    assert versions["cupy-cuda12x"] == "13.3.0"


# --- Markers ----------------------------------------------------------------------------------


def site_with(tmp_path: Path, *dists: tuple[str, str, Sequence[str]]) -> list[str]:
    for name, version, requires in dists:
        make_dist(tmp_path, name, version, requires)
    return [str(tmp_path)]


PYPI_TORCH_REQUIRES = (
    "filelock",
    "nvidia-cuda-runtime-cu12==12.4.127; platform_system == 'Linux' and platform_machine == 'x86_64'",
    "nvidia-cudnn-cu12==9.1.0.70; platform_system == 'Linux' and platform_machine == 'x86_64'",
)


@pytest.mark.parametrize(
    ("dists", "accelerator", "gpu_count", "expected"),
    [
        ([("torch", "2.3.0+cu121", ())], "cuda", 8, ["torch.cuda"]),
        ([("torch", "2.3.0+cu121", ())], "cpu", 0, []),
        ([("torch", "2.3.0+cpu", ())], "cuda", 1, []),
        (
            [
                ("torch", "2.5.1", PYPI_TORCH_REQUIRES),
                ("nvidia-cuda-runtime-cu12", "12.4.127", ()),
            ],
            "cuda",
            1,
            ["torch.cuda"],
        ),
        # The requirement is declared but its platform condition kept it from being installed.
        ([("torch", "2.5.1", PYPI_TORCH_REQUIRES)], "cuda", 1, []),
        ([("torch", "2.5.1+rocm6.2", ())], "rocm", 2, ["torch.rocm"]),
        ([("torch", "2.5.1", ())], "mps", 1, ["torch.mps"]),
        (
            [("jax", "0.4.35", ()), ("jaxlib", "0.4.35", ()), ("jax-cuda12-plugin", "0.4.35", ())],
            "cuda",
            1,
            ["jax.cuda"],
        ),
        ([("jax", "0.4.7", ()), ("jaxlib", "0.4.7+cuda11.cudnn86", ())], "cuda", 1, ["jax.cuda"]),
        ([("jax", "0.4.35", ()), ("jaxlib", "0.4.35", ())], "cuda", 1, []),
        ([("cupy-cuda12x", "13.3.0", ())], "cuda", 1, ["cupy.cuda"]),
        ([("cupy-cuda12x", "13.3.0", ())], "cpu", 0, []),
    ],
)
def test_markers_follow_the_rule_table(
    tmp_path: Path,
    dists: list[tuple[str, str, Sequence[str]]],
    accelerator: str,
    gpu_count: int,
    expected: list[str],
) -> None:
    installed = installed_distributions(site_with(tmp_path, *dists))
    assert markers_for(installed, accelerator, gpu_count) == expected


def test_every_marker_rule_is_a_framework_key() -> None:
    for rule in MARKER_RULES:
        assert framework_key(rule.marker) == rule.marker
        assert is_marker_key(rule.marker)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("torch", "torch"),
        ("Torch", "torch"),
        ("scikit_learn", "scikit-learn"),
        ("Flash__Attn", "flash-attn"),
        ("zope.interface", "zope-interface"),
        ("torch.cuda", "torch.cuda"),
        ("Torch.CUDA", "torch.cuda"),
        ("jax.cuda", "jax.cuda"),
        ("torch.mps", "torch.mps"),
    ],
)
def test_framework_key_matches_what_workers_report(key: str, expected: str) -> None:
    assert framework_key(key) == expected


def test_dotted_distribution_names_are_not_markers() -> None:
    assert not is_marker_key("zope.interface")
    assert not is_marker_key("torch")
    assert is_marker_key("Torch.Cuda")


# --- Whole probe with recorded tools ----------------------------------------------------------


def test_h100_box_with_a_cuda_torch(tmp_path: Path) -> None:
    site = site_with(tmp_path / "site", ("torch", "2.4.1+cu124", ()), ("numpy", "2.1.0", ()))
    caps = collect_capabilities(
        tmp_path, runner=Replay("h100_8x", tmp_path), system="Linux", search_path=site
    )
    assert caps.accelerator == "cuda"
    assert caps.gpu_count == 8
    assert caps.driver_version == "550.54.15"
    assert caps.cuda_version == "12.4"
    assert caps.markers == ["torch.cuda"]
    assert caps.frameworks == {"numpy": "2.1.0", "torch": "2.4.1+cu124"}


def test_no_driver_box_is_a_cpu_worker(tmp_path: Path) -> None:
    site = site_with(tmp_path / "site", ("torch", "2.4.1+cu124", ()))
    caps = collect_capabilities(
        tmp_path, runner=Replay("no_driver", tmp_path), system="Linux", search_path=site
    )
    assert (caps.accelerator, caps.gpus, caps.markers) == ("cpu", [], [])
    assert caps.driver_version is None
    assert caps.frameworks == {"torch": "2.4.1+cu124"}


def test_rocm_box_when_nvidia_smi_is_absent(tmp_path: Path) -> None:
    def runner(argv: Sequence[str]) -> CommandResult:
        if argv[0] == "rocm-smi":
            return CommandResult(0, ROCM_TWO_MI300X, "")
        return nothing_installed(argv)

    caps = collect_capabilities(tmp_path, runner=runner, system="linux", search_path=[])
    assert caps.accelerator == "rocm"
    assert caps.gpu_count == 2
    assert caps.driver_version == "6.8.5"
    assert caps.cuda_version is None


def test_apple_silicon_is_an_mps_worker_with_unified_memory(tmp_path: Path) -> None:
    answers: dict[tuple[str, ...], str] = {
        ("sysctl", "-n", "hw.memsize"): "68719476736\n",
        ("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M2 Max\n",
    }
    asked: list[tuple[str, ...]] = []

    def sysctl(argv: Sequence[str]) -> CommandResult:
        asked.append(tuple(argv))
        answer = answers.get(tuple(argv))
        return CommandResult(0, answer, "") if answer else nothing_installed(argv)

    site = site_with(tmp_path / "site", ("torch", "2.5.1", ()))
    caps = collect_capabilities(
        tmp_path, runner=sysctl, system="Darwin", machine="arm64", search_path=site
    )
    assert (caps.os, caps.cpu_arch, caps.accelerator) == ("darwin", "aarch64", "mps")
    assert caps.memory_gb == 64.0
    (gpu,) = caps.gpus
    assert (gpu.name, gpu.memory_gb, gpu.memory_kind) == ("Apple M2 Max", 64.0, "unified")
    assert caps.markers == ["torch.mps"]
    assert not any(argv[0] in ("nvidia-smi", "rocm-smi") for argv in asked)


def test_intel_mac_is_a_cpu_worker(tmp_path: Path) -> None:
    caps = collect_capabilities(
        tmp_path, runner=nothing_installed, system="Darwin", machine="x86_64", search_path=[]
    )
    assert (caps.accelerator, caps.gpus) == ("cpu", [])


# --- Host facts -------------------------------------------------------------------------------


def test_meminfo_total_in_gib() -> None:
    text = "MemTotal:       16303048 kB\nMemFree:         1123456 kB\n"
    assert parse_meminfo(text) == round(16303048 / 1024**2, 2)
    assert parse_meminfo("MemFree: 10 kB\n") is None


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("x86_64", "x86_64"),
        ("AMD64", "x86_64"),
        ("arm64", "aarch64"),
        ("aarch64", "aarch64"),
        ("riscv64", "riscv64"),
    ],
)
def test_cpu_arch_is_normalized(machine: str, expected: str) -> None:
    assert cpu_arch(machine) == expected


def test_disk_space_of_a_directory_not_yet_created(tmp_path: Path) -> None:
    free = disk_free_gb(tmp_path / "not" / "created")
    assert free is not None
    assert abs(free - shutil.disk_usage(tmp_path).free / 1024**3) < 1.0


# --- The real probe on this machine -----------------------------------------------------------


def test_real_probe_of_this_machine(tmp_path: Path) -> None:
    caps = probe_capabilities(tmp_path, refresh=True)
    assert caps.cpu_cores >= 1
    assert caps.memory_gb is not None and caps.memory_gb > 0
    assert caps.disk_gb is not None and caps.disk_gb > 0
    assert caps.os == platform.system().lower()
    assert caps.cpu_arch in set(CPU_ARCH_ALIASES.values()) | {platform.machine().lower()}
    assert caps.python_version == platform.python_version()
    assert caps.frameworks["pydantic"] == importlib.metadata.version("pydantic")
    assert caps.hostname
    has_vendor_tool = any(shutil.which(t) for t in ("nvidia-smi", "rocm-smi"))
    if caps.os == "linux" and not has_vendor_tool:
        assert caps.accelerator == "cpu"
        assert caps.gpus == []
    if caps.accelerator == "cpu":
        assert not [m for m in caps.markers if m.startswith("torch.")]


def test_probe_is_cached_until_refreshed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    first = probe_capabilities(tmp_path, refresh=True)
    assert "late-arrival" not in first.frameworks

    make_dist(site, "late_arrival", "1.0")
    first.frameworks["scribbled"] = "1"
    cached = probe_capabilities(tmp_path)
    assert "late-arrival" not in cached.frameworks
    assert "scribbled" not in cached.frameworks  # callers get copies

    assert probe_capabilities(tmp_path, refresh=True).frameworks["late-arrival"] == "1.0"


def test_probe_module_imports_no_ml_framework(tmp_path: Path) -> None:
    # A torch that refuses to be imported, installed where the probe will find its metadata.
    site = tmp_path / "site"
    make_dist(site, "torch", "2.4.1+cu124")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('the probe imported torch')\n")
    code = textwrap.dedent(
        """
        import json, sys
        from gpulayer.worker.probe import probe_capabilities
        caps = probe_capabilities(sys.argv[1])
        heavy = {"torch", "jax", "jaxlib", "cupy", "tensorflow", "mlx", "pynvml"}
        print(json.dumps({"loaded": sorted(heavy & set(sys.modules)),
                          "torch": caps.frameworks.get("torch")}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    assert report == {"loaded": [], "torch": "2.4.1+cu124"}
