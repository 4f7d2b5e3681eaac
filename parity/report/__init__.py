"""What the harness writes: report.json / report.md, the terminal table, plots, atomic files, the
machine's description."""
