"""``fleetrun.run``: a job on this machine, from a notebook or a script."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Mapping, Optional

from ._binary import fleetrun_binary
from ._errors import FleetrunError
from ._jobfile import JobLike, load_job, to_toml

__all__ = ["FailedItem", "RunResult", "run"]

# `fleetrun run`'s exit codes (docs/contract.md).
_ENDED = {0: "Completed", 42: "Failed", 43: "Canceled"}


@dataclass(frozen=True)
class FailedItem:
    """One row of the job's ``logs/failed_items.csv``."""

    item: str
    mini_batch: int
    attempts: int
    cause: str


@dataclass(frozen=True)
class RunResult:
    """What ``fleetrun run`` did."""

    job_id: str
    #: ``Completed``, ``Failed`` or ``Canceled``.
    state: str
    #: ``fleetrun``'s exit code: 0 completed, 42 failed, 43 canceled.
    exit_code: int
    succeeded_items: int
    failed_items: int
    completed_mini_batches: int
    failed_mini_batches: int
    #: The output file (``append_row``); ``None`` when the job failed before writing it.
    output: Optional[Path]
    #: The job's output folder; its ``logs/`` holds what happened.
    output_dir: Path
    #: Why it failed or was canceled.
    cause: Optional[str]
    #: The items that failed, from ``logs/failed_items.csv``.
    failed: List[FailedItem] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        return self.state == "Completed"

    @property
    def logs(self) -> Path:
        return self.output_dir / "logs"


def run(
    job: JobLike,
    *,
    processes: Optional[int] = None,
    progress: bool = True,
    resume: bool = False,
    allow_empty_input: bool = False,
    timeout: Optional[float] = None,
    binary: Optional[str] = None,
    **overrides: Any,
) -> RunResult:
    """Runs ``job`` on this machine with ``fleetrun run`` and returns what it did.

    ``job`` is a job file's path (TOML, or an Azure ML v2 YAML) or a dict of its fields
    (relative paths taken from the current folder). Each keyword in ``overrides`` sets a job
    parameter for this run, as ``--set key=value`` does (``mini_batch_size=5``,
    ``error_threshold=-1``). ``processes`` is the number of runner processes (default: the
    job's ``process_count_per_node``, else the cores).

    ``progress`` prints one line that follows the job (mini-batches and items done), where a
    notebook shows it. A job that ends Failed or Canceled is returned, not raised: look at
    ``result.completed`` and ``result.cause``. A job file that does not validate, or a run
    that cannot start, raises :class:`FleetrunError` with fleetrun's message; ``timeout``
    seconds passing first stops the run (SIGINT, as Ctrl-C would) and raises it too.
    """
    exe = fleetrun_binary(binary)
    with tempfile.TemporaryDirectory(prefix="fleetrun-run-") as scratch:
        if isinstance(job, Mapping):
            job_file = Path(scratch) / "job.toml"
            job_file.write_text(to_toml(load_job(job)), encoding="utf-8")
        else:
            job_file = Path(os.fspath(job))
        args = [exe, "run", str(job_file), "--quiet"]
        for key, value in overrides.items():
            args += ["--set", f"{key}={_setting(value)}"]
        if processes is not None:
            args += ["--processes", str(processes)]
        if resume:
            args.append("--resume")
        if allow_empty_input:
            args.append("--allow-empty-input")
        done = _run_following(args, _output_dir_guess(job, job_file), progress, timeout)
    return _result(done.returncode, done.stdout, done.stderr)


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _output_dir_guess(job: JobLike, job_file: Path) -> Optional[Path]:
    """The job's output folder, to follow its progress file: only a plain TOML's local one."""
    try:
        spec = load_job(job)
    except FleetrunError:
        return None
    path = (spec.get("output") or {}).get("path")
    return Path(path) if isinstance(path, str) and "://" not in path else None


def _run_following(args: List[str], output_dir: Optional[Path], progress: bool,
                   timeout: Optional[float]) -> "subprocess.CompletedProcess[str]":
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout: List[str] = []
    stderr: List[str] = []
    readers = [threading.Thread(target=_drain, args=(child.stdout, stdout), daemon=True),
               threading.Thread(target=_drain, args=(child.stderr, stderr), daemon=True)]
    for reader in readers:
        reader.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = ""
    try:
        while child.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                child.send_signal(signal.SIGINT)  # fleetrun stops the job, writes its logs
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                raise FleetrunError(f"fleetrun run did not end within {timeout:g} s: stopped")
            if progress and output_dir is not None:
                shown = _show(output_dir, shown)
            time.sleep(0.5)
    except BaseException:
        if child.poll() is None:
            child.kill()
            child.wait()
        raise
    for reader in readers:
        reader.join(timeout=10)
    if progress and output_dir is not None:
        _show(output_dir, shown)
        sys.stdout.write("\n")
        sys.stdout.flush()
    return subprocess.CompletedProcess(args, child.returncode, "".join(stdout), "".join(stderr))


def _drain(stream: Optional[IO[str]], into: List[str]) -> None:
    if stream is not None:
        for line in stream:
            into.append(line)


def _overview(output_dir: Path) -> Dict[str, str]:
    """``logs/job_progress_overview.txt`` as ``key: value`` pairs (kept up to date while a
    job with a local output runs)."""
    try:
        text = (output_dir / "logs" / "job_progress_overview.txt").read_text(encoding="utf-8")
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _show(output_dir: Path, shown: str) -> str:
    seen = _overview(output_dir)
    if not seen:
        return shown
    line = (f"fleetrun: {seen.get('Mini-batches processed', '0')} of "
            f"{seen.get('Mini-batches created', '?')} mini-batches, "
            f"{seen.get('Items succeeded', '0')} items succeeded, "
            f"{seen.get('Items failed', '0')} failed, {seen.get('State', '')}")
    if line != shown:
        sys.stdout.write("\r" + line)
        sys.stdout.flush()
    return line


def _result(code: int, stdout: str, stderr: str) -> RunResult:
    said: Dict[str, str] = {}
    job_id = ""
    for line in stdout.splitlines():
        if line.startswith("Job ") and not job_id:
            job_id = line.split()[1]
        elif ":" in line:
            key, value = line.split(":", 1)
            said[key.strip()] = value.strip()
    if code not in _ENDED or "Logs" not in said:
        message = stderr.strip().splitlines()
        raise FleetrunError(message[-1] if message else f"fleetrun run exited {code}")
    output_dir = Path(said["Logs"]).parent
    seen = _overview(output_dir)

    def count(key: str) -> int:
        try:
            return int(seen.get(key, "0").split()[0])
        except ValueError:
            return 0

    return RunResult(
        job_id=job_id,
        state=_ENDED[code],
        exit_code=code,
        succeeded_items=count("Items succeeded"),
        failed_items=count("Items failed"),
        completed_mini_batches=count("Mini-batches processed"),
        failed_mini_batches=count("Mini-batches failed"),
        output=Path(said["Output"]) if "Output" in said else None,
        output_dir=output_dir,
        cause=said.get("Cause") or seen.get("Cause"),
        failed=_failed_items(output_dir / "logs" / "failed_items.csv"),
    )


def _failed_items(path: Path) -> List[FailedItem]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [
                FailedItem(row["item"], int(row["mini_batch"]), int(row["attempts"]), row["cause"])
                for row in csv.DictReader(f)
            ]
    except OSError:
        return []
