"""The command lines: ``python -m parity run`` (:mod:`parity.cli.run`) and ``python -m parity sweep``
(:mod:`parity.cli.sweep`), their option checks, output folders and pre-run memory estimates."""
