"""What the remat doctor found: :class:`Problem`, :class:`Region`, :class:`Diagnosis` and its table.

``str(diagnosis)`` is a plain-text table of every remat region (rendered with ``rich``, no colour),
the compiled program's numbers, and one line per problem. Bytes are kept in bytes and converted
for display only.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["Diagnosis", "PROBLEM_KINDS", "Problem", "Region", "format_bytes"]

PROBLEM_KINDS = ("policy-name-missing", "remat-not-surviving", "offload-not-host", "stacked-output", "policy-dropped")
"""The kinds of :class:`Problem`, in the order the doctor checks them (docs/doctor.md defines each)."""


def format_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"-"``."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem found.

    Attributes:
        kind: one of :data:`PROBLEM_KINDS`.
        where: the place: ``"region #2 (save_only_these_names('mlp')) in scan(24) at model.py:40"``, or
            a scan for ``stacked-output``.
        message: what is wrong, in one sentence, with the numbers.
        fix: what to change, in one sentence.
        region: the region's number (1-based, as in the table), or None (a scan, not a region).
    """

    kind: str
    where: str
    message: str
    fix: str
    region: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}; fix: {self.fix}"


@dataclasses.dataclass(frozen=True)
class Region:
    """One remat region (one ``jax.checkpoint`` call site) and what it keeps.

    Attributes:
        number: 1-based, in the order JAX differentiated the regions.
        policy: the policy's description (:func:`jaxremat.doctor.policy_probe.describe_policy`).
        position: transformations around it, outermost first (``("vmap", "scan(24)")``).
        site: ``"path:line"`` of the user code that leads to it, or ``""``.
        function: where the checkpointed function is defined (JAX's ``func_src_info``).
        tags: the ``checkpoint_name`` tags of the operations inside it.
        saved_names, offloaded_names: the tags its policy saves and offloads.
        calls: how many times its recompute runs in the program (its equations times the scan lengths around them).
        kept_bytes_per_call: residual bytes one call keeps for the backward pass beyond its inputs (traced).
        offloaded_bytes_per_call: those of them in host memory.
        everything_bytes_per_call, nothing_bytes_per_call: the same under ``everything_saveable`` / ``nothing_saveable``.
        promised_saving_bytes: device bytes its policy keeps less than ``everything_saveable``, all
            calls (traced; on a CPU backend, where host memory is device memory, offloaded bytes count as kept).
        compiled_saving_bytes: compiled temp bytes of the program with this region at
            ``everything_saveable`` less those of the program as it is; None when not compiled.
    """

    number: int
    policy: str
    position: tuple[str, ...]
    site: str
    function: str
    tags: tuple[str, ...]
    saved_names: tuple[str, ...]
    offloaded_names: tuple[str, ...]
    calls: int
    kept_bytes_per_call: int
    offloaded_bytes_per_call: int
    everything_bytes_per_call: int
    nothing_bytes_per_call: int
    promised_saving_bytes: int
    compiled_saving_bytes: int | None = None

    @property
    def kept_bytes(self) -> int:
        """Residual bytes kept by all its calls (traced)."""
        return self.kept_bytes_per_call * self.calls

    def place(self) -> str:
        """``"region #N (POLICY) in scan(24) at path:line"``."""
        inside = f" in {' > '.join(self.position)}" if self.position else ""
        at = f" at {self.site}" if self.site else ""
        return f"region #{self.number} ({self.policy}){inside}{at}"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The doctor's report on one program.

    Attributes:
        program: what was checked, e.g. ``"value_and_grad(loss)"`` or ``"train_step"``.
        regions: every remat region found.
        problems: every problem found (empty: nothing found).
        compiled: the program's compiled numbers (``temp_bytes``, ``dots_before``, ``dots_after``,
            ``backend``, ``host_buffers``), or None when not compiled.
        notes: remarks that are not problems (no remat region found, a check skipped and why).
    """

    program: str
    regions: tuple[Region, ...]
    problems: tuple[Problem, ...]
    compiled: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def kinds(self) -> list[str]:
        """The kinds of the problems found, in order, each once."""
        return list(dict.fromkeys(p.kind for p in self.problems))

    def table(self) -> Table:
        """The regions as a ``rich`` table."""
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for header, justify in (("#", "right"), ("at", "left"), ("inside", "left"), ("policy", "left"),
                                ("tags", "left"), ("calls", "right"), ("kept/call", "right"),
                                ("kept (traced)", "right"), ("saving: compiled / traced", "right")):
            table.add_column(header, justify=justify)
        for r in self.regions:
            saving = (f"{format_bytes(r.compiled_saving_bytes)} / {format_bytes(r.promised_saving_bytes)}"
                      if r.compiled_saving_bytes is not None else f"- / {format_bytes(r.promised_saving_bytes)}")
            kept = format_bytes(r.kept_bytes_per_call)
            if r.offloaded_bytes_per_call:
                kept += f" ({format_bytes(r.offloaded_bytes_per_call)} host)"
            table.add_row(str(r.number), r.site or r.function or "?", " > ".join(r.position) or "-", r.policy,
                          ", ".join(r.tags) or "-", str(r.calls), kept, format_bytes(r.kept_bytes), saving)
        return table

    def __str__(self) -> str:
        out = io.StringIO()
        console = Console(file=out, width=200, no_color=True, color_system=None, force_terminal=False,
                          highlight=False, emoji=False, markup=False)
        n = len(self.problems)
        console.print(f"remat doctor: {self.program}: {len(self.regions)} remat region(s), "
                      f"{n} problem{'s' if n != 1 else ''}", soft_wrap=True)
        if self.regions:
            console.print(self.table())
        if self.compiled:
            c = self.compiled
            console.print(f"compiled ({c['backend']}): temp {format_bytes(c['temp_bytes'])}, matrix products "
                          f"{c['dots_before']} before / {c['dots_after']} after XLA's optimization", soft_wrap=True)
        for note in self.notes:
            console.print(f"note: {note}", soft_wrap=True)
        for p in self.problems:
            console.print(str(p), soft_wrap=True)
        return out.getvalue().rstrip("\n")
