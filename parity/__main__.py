"""``python -m parity``: see :mod:`parity.cli`."""

import sys

from .cli import main

sys.exit(main())
