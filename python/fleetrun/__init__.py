"""fleetrun from Python.

fleetrun runs a Python scoring script (``init()`` once per process, ``run(mini_batch)`` per
mini-batch) over many files or table rows in parallel: on this machine (``fleetrun run``)
or on a fleet of workers (RabbitMQ + Redis + S3) that ``fleetrun serve`` takes jobs for.
This package is the Python side of it:

- :func:`run` runs a job on this machine, from a notebook or a script, and returns its
  counts, output path and failed items (:class:`RunResult`);
- :class:`Client` submits jobs to ``fleetrun serve`` and follows them (:class:`Job`,
  :class:`JobStatus`), raising :class:`BadJob`, :class:`NotFound`, :class:`Conflict`,
  :class:`Unauthorized` (all :class:`FleetrunError`);
- :func:`verify_webhook` checks a job's webhook was signed by the fleet.

The wheel also installs the ``fleetrun``, ``fleetrun-worker`` and ``fleetrun-runner``
binaries on the environment's ``PATH``. Only the standard library is used. See
docs/python.md ("From Python").
"""

from ._binary import fleetrun_binary
from ._client import Client, Job
from ._errors import (
    ApiError,
    BadJob,
    Conflict,
    FleetrunError,
    JobEnded,
    NotFound,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from ._run import FailedItem, RunResult, run
from ._status import Counts, JobState, JobStatus
from ._webhook import EVENT_HEADER, SIGNATURE_HEADER, verify_webhook

__all__ = [
    "ApiError",
    "BadJob",
    "Client",
    "Conflict",
    "Counts",
    "EVENT_HEADER",
    "FailedItem",
    "FleetrunError",
    "Job",
    "JobEnded",
    "JobState",
    "JobStatus",
    "NotFound",
    "RunResult",
    "SIGNATURE_HEADER",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "fleetrun_binary",
    "run",
    "verify_webhook",
]
