"""The machine and library versions a report was measured on, and the memory it has.

:func:`environment_info` goes into ``report.json`` / ``sweep.json`` as ``environment``: platform,
CPU model and core count, load average at the start (timings on a shared machine are noise),
Python and the versions of jax, jaxlib, flax, torch and numpy (``importlib.metadata``, without
importing them), and the devices each framework of the run computes on (:func:`devices`).
:func:`available_memory_bytes` reads what a run may still allocate.
"""

from __future__ import annotations

# Deferred imports: the frameworks are imported only to read their versions and devices, when a report is
# written.

import os
import platform
import sys
from importlib import metadata

LIBRARIES = ("jax", "jaxlib", "flax", "torch", "numpy", "rich", "safetensors", "tokenizers")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "processor\t: ")) and ":" in line:
                    value = line.split(":", 1)[1].strip()
                    if value and not value.isdigit():
                        return value
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def library_versions() -> dict[str, str | None]:
    """``{distribution: version}`` of :data:`LIBRARIES`; None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def devices(frameworks=(), torch_device: str = "cpu") -> dict[str, list[str]]:
    """The devices each of ``frameworks`` computes on, e.g. ``{"jax": ["cpu: cpu"], "torch": ["cpu"]}``.

    JAX: ``platform: device_kind`` of each ``jax.devices()`` entry (read only when jax is already
    imported, i.e. its backend started). PyTorch: ``torch_device`` (the parity runners compute
    on ``"cpu"``); for ``"cuda"``, the names of the CUDA devices.
    """
    out: dict[str, list[str]] = {}
    jax = sys.modules.get("jax")
    if "jax" in frameworks and jax is not None:
        try:
            out["jax"] = [f"{d.platform}: {d.device_kind}" for d in jax.devices()]
        except Exception:  # a backend that cannot start is refused earlier (cli_checks.check_jax_platform)
            out["jax"] = []
    if "torch" in frameworks and torch_device == "cuda":
        import torch

        out["torch"] = [f"cuda: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    elif "torch" in frameworks:
        out["torch"] = [torch_device]
    return out


def environment_info(frameworks=(), torch_device: str = "cpu") -> dict:
    """The machine, the library versions and the devices of ``frameworks`` (:func:`devices`), for
    a report (all strings and numbers)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "platform": platform.platform(), "machine": platform.machine(), "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(), "load_average_1_5_15min": load,
        "memory_available_bytes": available_memory_bytes(),
        "python": platform.python_version(), "versions": library_versions(),
        "jax_platforms": os.environ.get("JAX_PLATFORMS"), "devices": devices(frameworks, torch_device),
    }


def available_memory_bytes() -> int | None:
    """Bytes of memory a new allocation may still use (psutil, else /proc/meminfo, else sysconf).

    Returns None when none of them can say.
    """
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # not installed, or no reading on this platform
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None
