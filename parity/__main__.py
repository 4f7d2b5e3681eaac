"""``python -m parity``: see :mod:`parity.cli.run`."""

import sys

from parity.cli.run import main

sys.exit(main())
