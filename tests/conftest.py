"""Session-wide test settings: how many pytest-xdist workers ``-n auto`` (pyproject addopts) starts.

The suite runs in parallel workers, one test file per worker at a time (``--dist loadfile``, so a
file's module fixtures are computed once). Most of a worker's time is XLA's compile, which runs on
one core, so on 2 cores two workers finish sooner than one process. Each worker peaks at about
5 GiB of resident memory (measured, ``/usr/bin/time -v``), so the count is capped by the memory
available as well as by the CPUs this process may use. ``-n 0`` runs in one process.
"""

import os

WORKER_BYTES = 6 * 2**30
"""Memory set aside per worker (bytes): the measured ~5 GiB peak plus headroom."""


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto``: min(usable CPUs, available memory / WORKER_BYTES), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, min(cpus, available // WORKER_BYTES))
