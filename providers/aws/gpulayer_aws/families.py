"""The GPU model of each EC2 GPU family. The price lists give a type's GPU count and memory but
not its model, which offers need (jobs ask for models by name)."""

from __future__ import annotations

# Family (the part of the type name before the dot) -> (GPU model, maker).
GPU_FAMILIES: dict[str, tuple[str, str]] = {
    "g3": ("M60", "NVIDIA"),
    "g3s": ("M60", "NVIDIA"),
    "g4dn": ("T4", "NVIDIA"),
    "g4ad": ("Radeon Pro V520", "AMD"),
    "g5": ("A10G", "NVIDIA"),
    "g5g": ("T4g", "NVIDIA"),
    "g6": ("L4", "NVIDIA"),
    "gr6": ("L4", "NVIDIA"),
    "g6f": ("L4", "NVIDIA"),
    "gr6f": ("L4", "NVIDIA"),
    "g6e": ("L40S", "NVIDIA"),
    "g7e": ("RTX PRO Server 6000", "NVIDIA"),
    "p3": ("V100", "NVIDIA"),
    "p3dn": ("V100", "NVIDIA"),
    "p4d": ("A100", "NVIDIA"),
    "p4de": ("A100", "NVIDIA"),
    "p5": ("H100", "NVIDIA"),
    "p5e": ("H200", "NVIDIA"),
    "p5en": ("H200", "NVIDIA"),
    "p6-b200": ("B200", "NVIDIA"),
    "p6-b300": ("B300", "NVIDIA"),
}


def family_of(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def gpu_model(instance_type: str) -> tuple[str, str] | None:
    return GPU_FAMILIES.get(family_of(instance_type))
