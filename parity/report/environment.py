"""The machine and library versions a report was measured on, and the memory it has.

:func:`environment_info` goes into ``report.json`` / ``sweep.json`` as ``environment``: platform,
CPU model and core count, load average at the start (timings on a shared machine are noise),
Python and the versions of jax, jaxlib, flax, torch and numpy (``importlib.metadata``, without
importing them), and the devices each framework of the run computes on (:func:`devices`).
:func:`available_memory_bytes` reads what a run may still allocate.
"""

from __future__ import annotations

# Deferred imports: psutil is optional; it is imported where the available memory is read.

import os
import platform
from importlib import metadata

from parity.runners.framework import get_framework

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


def devices(frameworks=(), on_gpu: bool = False) -> dict[str, list[str]]:
    """The devices each of ``frameworks`` computes on, e.g. ``{"jax": ["cpu: cpu"], "torch": ["cpu"]}``
    (:meth:`parity.runners.framework.Framework.devices`; ``on_gpu``: the run computes on the GPU)."""
    return {fw: get_framework(fw).devices(on_gpu) for fw in frameworks}


def environment_info(frameworks=(), on_gpu: bool = False) -> dict:
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
        "jax_platforms": os.environ.get("JAX_PLATFORMS"), "devices": devices(frameworks, on_gpu),
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
