"""One-off measurements behind claims in docs/ (``python -m parity.experiments.<name>``)."""
