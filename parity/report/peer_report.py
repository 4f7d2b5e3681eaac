"""The peer step in the reports: a peer library's own checkpointing beside our ``full`` (report.md, terminal).

One row per ``peer_step`` entry of report.json (:func:`parity.runners.torch_peer.hf_checkpointing_peer`).
"""

from __future__ import annotations

from rich.console import Console

from parity.report.format import fmt_bytes, md_table
from parity.report.terminal import fitted_table

PEER_STEP_TITLE = "A training step beside the peer's own checkpointing (same weights and batch, dropout off)"

PEER_STEP_COLUMNS = ("check", "dtype", "B x T", "peak act (peer ckpt / ours full)", "peak act ratio",
                     "ckpt/none (peer, ours)", "time ratio [range]", "none: peak, time ratio", "grads err", "tol",
                     "bitwise to none", "ok")
"""The columns of :func:`peer_step_row`. Ratios are the peer's over ours (same step, same round for time)."""


def _ratio_range(x: dict) -> str:
    lo, hi = x["time_ratio_range"]
    return f"{x['time_ratio']:.2f} [{lo:.2f}-{hi:.2f}]"


def peer_step_row(x: dict) -> list[str]:
    """One peer step as display strings, in :data:`PEER_STEP_COLUMNS` order (a skipped or failed row: its note)."""
    ok = {True: "yes", False: "NO", None: "skipped"}[x["ok"]]
    if "peak_activation_bytes" not in x:
        return [x["check"], x["dtype"], *["-"] * 9, f"{ok}: {x.get('note', '')}"]
    (hf, ours, hf_none, ours_none), act = tuple(x["peak_activation_bytes"]), x["peak_activation_bytes"]
    ckpt = x["checkpointing_peak_ratio"]
    bitwise = "/".join("yes" if v else "NO" for v in x["bitwise_to_none"].values())
    return [x["check"], x["dtype"], f"{x['batch_size']} x {x['seq_len']}",
            f"{fmt_bytes(act[hf])} / {fmt_bytes(act[ours])}", f"{x['peak_ratio']:.2f}",
            f"{ckpt['transformers']:.2f}, {ckpt['torchref']:.2f}", _ratio_range(x),
            f"{x['none']['peak_ratio']:.2f}, {_ratio_range(x['none'])}", f"{x['max_rel_err_grads']:.2e}",
            f"{x['tolerance']:.0e}", bitwise, ok]


def peer_step_markdown(report: dict) -> list[str]:
    """report.md's section of the peer steps (no lines when the report has none)."""
    rows = report.get("peer_step") or []
    if not rows:
        return []
    notes = [f"- {x['check']}: {x['note']}" for x in rows if x.get("note")]
    return [f"## {PEER_STEP_TITLE}", "", md_table(PEER_STEP_COLUMNS, [peer_step_row(x) for x in rows]), "", *notes, ""]


def print_peer_steps(report: dict, console: Console) -> None:
    """The peer steps as a terminal table (nothing when the report has none): one row per measure of
    :data:`PEER_STEP_COLUMNS` and one column per peer step, so that it fits 80 columns as the other tables
    do (:func:`parity.report.terminal.fitted_table`: cells fold, no header or cell is cut); a failed step's
    column header is marked ``(NO)``. report.md keeps one row per step."""
    rows = report.get("peer_step") or []
    if not rows:
        return
    cells = [peer_step_row(x) for x in rows]
    headers = ["measure", *(c[0] + (" (NO)" if x["ok"] is False else "") for c, x in zip(cells, rows))]
    body = [[name, *(c[i] for c in cells)] for i, name in enumerate(PEER_STEP_COLUMNS) if i > 0]
    console.print(fitted_table(PEER_STEP_TITLE, headers, body, left=[True] * len(headers)))
