"""The exceptions of the fleetrun package: one base, one class per answer a caller acts on."""

from __future__ import annotations

from typing import Optional

__all__ = [
    "FleetrunError",
    "ApiError",
    "BadJob",
    "NotFound",
    "Conflict",
    "Unauthorized",
    "Unavailable",
    "JobEnded",
    "WaitTimeout",
]


class FleetrunError(Exception):
    """Every error this package raises."""


class ApiError(FleetrunError):
    """The API answered with an error: ``status`` is its HTTP status, ``message`` the one
    line ``fleetrun`` would print (the body's ``error``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BadJob(ApiError):
    """The job was refused: not a submission (400) or it does not validate (422). The
    message names the field and the rule, as ``fleetrun submit`` would."""


class NotFound(ApiError):
    """No job has this id (404)."""


class Conflict(ApiError):
    """The id is known with another job (409): submitting the same job again attaches to it;
    another job needs another id."""


class Unauthorized(ApiError):
    """The bearer token is missing or wrong (401)."""


class Unavailable(ApiError):
    """The server, its ledger or its broker does not answer (503 and the like), or the
    server could not be reached."""


class JobEnded(FleetrunError):
    """A job ended other than Completed (Failed, Canceled or Expired), raised by
    :meth:`fleetrun.Job.wait`; ``status`` is its last :class:`fleetrun.JobStatus`."""

    def __init__(self, status: "object") -> None:
        state = getattr(status, "state", "?")
        cause: Optional[str] = getattr(status, "cause", None)
        job_id = getattr(status, "job_id", "?")
        super().__init__(f"job {job_id} ended {state}" + (f": {cause}" if cause else ""))
        self.status = status


class WaitTimeout(FleetrunError):
    """:meth:`fleetrun.Job.wait` ran out of time before the job ended; ``status`` is the
    last one seen."""

    def __init__(self, status: "object", timeout: float) -> None:
        super().__init__(
            f"job {getattr(status, 'job_id', '?')} is still {getattr(status, 'state', '?')} "
            f"after {timeout:g} s"
        )
        self.status = status
