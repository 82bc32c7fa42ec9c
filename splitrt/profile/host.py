"""The machine and runtime a profile is measured on: host facts, host class, providers, threads."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

PROVIDER_PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict[str, Any]:
    freq = psutil.cpu_freq()
    return {
        "class": host_class(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_model": _cpu_model(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_physical": psutil.cpu_count(logical=False),
        "freq_mhz": round(freq.max or freq.current, 1) if freq else None,
        "memory_mb": psutil.virtual_memory().total // (1 << 20),
        "python": platform.python_version(),
    }


def host_class() -> str:
    """``<machine>-<n>core``, e.g. ``x86_64-2core``: the prefix of shipped profile names."""
    return f"{platform.machine()}-{psutil.cpu_count(logical=True)}core"


def pick_providers(preferred: Sequence[str] | None = None) -> list[str]:
    """The best available execution provider first (TensorRT, CUDA, then CPU), CPU always last."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    order = list(preferred) if preferred else list(PROVIDER_PREFERENCE)
    chosen = [p for p in order if p in available and p != "CPUExecutionProvider"]
    return [*chosen, "CPUExecutionProvider"]


def default_threads() -> int:
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
