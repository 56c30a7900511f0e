"""Start real worker processes on this host and wait on jobs: for the end-to-end tests and the pipeline
benchmark (production runs workers through docker-compose or a process manager instead)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from workers.db_models import FINAL, Job
from workers.jobstore import SessionFactory


@dataclass
class WorkerProcess:
    """A ``specscribe worker ...`` process, in its own process group, logging to ``log_path``."""

    args: list[str]
    log_path: Path
    popen: subprocess.Popen
    log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL the worker and every process it started (a crash, as far as Celery can tell)."""
        self._signal_group(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL the group if it is still there after ``timeout``."""
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)
        self._signal_group(signal.SIGKILL)
        self.popen.wait(timeout=30)
        self.log.close()

    def _signal_group(self, sig: signal.Signals) -> None:
        # Only while the leader is unreaped: its pid (the group id) cannot have been reused then.
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)


def start_worker(args: list[str], env: Mapping[str, str], log_path: Path) -> WorkerProcess:
    """Run ``specscribe worker <args>`` with ``env`` added to this process's environment."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 (closed by WorkerProcess.stop)
    popen = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "worker", *args],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return WorkerProcess(args, log_path, popen, log)


def wait_until(
    predicate: Callable[[], object], timeout: float, interval: float = 0.2, what: str = "condition"
) -> object:
    """Poll ``predicate`` until it returns something truthy (returned); ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(interval)


def wait_for_job(sessions: SessionFactory, job_id: str, timeout: float, interval: float = 0.2) -> Job:
    """Poll the job store until the job is done, failed or cancelled; returns it (with its recordings)."""

    def finished() -> Job | None:
        with sessions() as session:
            job = session.get(Job, job_id)
            if job is not None and job.status in FINAL:
                _ = [r.chunks for r in job.recordings]  # load while the session is open
                return job
            return None

    return wait_until(finished, timeout, interval, what=f"job {job_id} finished")
