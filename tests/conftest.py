"""Session-wide test settings: how many pytest-xdist workers ``-n auto`` (pyproject addopts) starts.

The suite runs in parallel workers, one test file per worker at a time (``--dist loadfile``, so a
file's module fixtures are computed once). Most of a worker's time is XLA's compile, which runs on
one core, so on 2 cores two workers finish sooner than one process. Each worker peaks at about
5 GiB of resident memory (measured, ``/usr/bin/time -v``), so the count is capped by the memory
available as well as by the CPUs this process may use. ``-n 0`` runs in one process.
"""

import os
import shutil
import sys
import tempfile

import pytest

# A JAX persistent compilation cache shared by the xdist workers (and the CLI subprocesses some tests
# start, which inherit the environment): set here, before any test module imports jax. A cache hit
# is the same serialized executable (same bits; memory_analysis() and as_text() are kept, checked on
# jax 0.10.2 CPU). The directory is fresh per session, made by the controller and inherited by the
# workers, and removed at the end; JAXREMAT_TEST_JAX_CACHE=0 turns it off. Every executable is
# cached, however short its compile: the op-by-op (eager) runs compile one small program per
# primitive and shape, ~40 ms each, the same in every worker and CLI subprocess (a second
# `python -m parity run --model gpt-tiny` of two plans: 35 s cold, 14 s from the cache).
_OWN_CACHE = None
if os.environ.get("JAXREMAT_TEST_JAX_CACHE", "1") != "0" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="jaxremat-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


# One compute thread per xdist worker (and per CLI subprocess a test starts) when two or more workers
# run: the workers already fill the cores, and a second thread per framework (torch's OpenMP pool,
# XLA:CPU's Eigen pool) only waits and spins. Measured on 2 cores, tests/jaxremat/test_render.py with
# tests/torchref/test_compiled.py in one process: 135 s of CPU with the default threads, 115 s with
# one. Every bitwise test compares two programs run under the same setting, so the setting changes no
# assertion; JAXREMAT_TEST_THREADS=default keeps the frameworks' own thread counts.
if (int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= 2
        and os.environ.get("JAXREMAT_TEST_THREADS", "one") != "default"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    if "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Remove the session's compilation cache (only in the process that made it); end an xdist worker.

    A worker ends here, without the interpreter's teardown. By now it has sent every report and its
    ``workerfinished`` event to the controller (``xdist.remote.WorkerInteractor.pytest_sessionfinish``),
    and the controller's summary waits for the worker processes to exit. Tearing down a worker's
    interpreter (its ~5 GiB of traced and compiled programs, JAX's and torch's exit handlers) took
    7-9 s of the suite's wall time, measured on 2 cores: last test done at 432.4 s, summary at 441.3 s.
    Nothing a test checks happens there: the workers' temporary directories and the compilation cache
    belong to the controller, which ends as usual (as does ``-n 0``, one process).
    """
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
    if hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


WORKER_BYTES = 6 * 2**30
"""Memory set aside per worker (bytes): the measured ~5 GiB peak plus headroom."""


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto``: min(usable CPUs, available memory / WORKER_BYTES), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, min(cpus, available // WORKER_BYTES))


# ---------------------------------------------------------------- opt-in measurement tests
# Tests marked ``jaxremat_slow`` pin down measured XLA facts (mechanism proofs, float64, unrolled
# stacks) at ~10 s of compiles each; they run with ``JAXREMAT_SLOW_TESTS=1`` and are reported as
# skipped otherwise, so that the default run stays within its time on 2 CPU cores (any test package may use the mark).
SLOW_ENV = "JAXREMAT_SLOW_TESTS"


def pytest_configure(config):
    config.addinivalue_line("markers", f"jaxremat_slow: XLA measurement test; runs with {SLOW_ENV}=1")


def pytest_collection_modifyitems(config, items):
    if os.environ.get(SLOW_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"measurement test (XLA compiles); run with {SLOW_ENV}=1")
    for item in items:
        if item.get_closest_marker("jaxremat_slow"):
            item.add_marker(skip)


# ---------------------------------------------------------------- per-test CPU profile (opt-in)
# JAXREMAT_TEST_CPU_PROFILE=DIR writes one line per test phase (setup, call, teardown) to
# DIR/<worker>.tsv: the nodeid, the phase, CPU seconds (user+sys of the process and of the children
# it waited for) and the wall-clock start and end, to find the tests that cost the most CPU.
_CPU_PROFILE = os.environ.get("JAXREMAT_TEST_CPU_PROFILE")
if _CPU_PROFILE:
    import resource
    import time

    def _cpu_s() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def _profile(item, phase):
        cpu0, t0 = _cpu_s(), time.time()
        yield
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        os.makedirs(_CPU_PROFILE, exist_ok=True)
        with open(os.path.join(_CPU_PROFILE, f"{worker}.tsv"), "a") as f:
            f.write(f"{item.nodeid}\t{phase}\t{_cpu_s() - cpu0:.3f}\t{t0:.3f}\t{time.time():.3f}\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(item):
        yield from _profile(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        yield from _profile(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item):
        yield from _profile(item, "teardown")
