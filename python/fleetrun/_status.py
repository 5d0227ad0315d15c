"""A job's status as the API answers it, typed."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

__all__ = ["JobState", "Counts", "JobStatus"]


class JobState(str, enum.Enum):
    """Where a job stands. ``Running`` and ``Finalizing`` go on; the others are ends."""

    RUNNING = "Running"
    FINALIZING = "Finalizing"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELED = "Canceled"
    EXPIRED = "Expired"

    @property
    def ended(self) -> bool:
        """Whether the job has ended (Completed, Failed, Canceled or Expired)."""
        return self not in (JobState.RUNNING, JobState.FINALIZING)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Counts:
    """Mini-batches and items of a job so far."""

    #: Mini-batches in the job; ``None`` until its input is fully listed.
    total_mini_batches: Optional[int]
    #: Mini-batches done (succeeded or failed).
    completed_mini_batches: int
    #: Mini-batches that failed (all their attempts, or a short return).
    failed_mini_batches: int
    succeeded_items: int
    failed_items: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Counts":
        total = data.get("total_mini_batches")
        return cls(
            total_mini_batches=None if total is None else int(total),
            completed_mini_batches=int(data.get("completed_mini_batches", 0)),
            failed_mini_batches=int(data.get("failed_mini_batches", 0)),
            succeeded_items=int(data.get("succeeded_items", 0)),
            failed_items=int(data.get("failed_items", 0)),
        )


def _state(text: str) -> Union[JobState, str]:
    try:
        return JobState(text)
    except ValueError:
        return text  # a state this package does not know yet


def _float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


@dataclass(frozen=True)
class JobStatus:
    """One job's summary (``GET /v1/jobs/{id}``)."""

    job_id: str
    #: The job's name (its file's ``name``).
    name: str
    #: The worker pool that serves it.
    pool: str
    state: Union[JobState, str]
    counts: Counts
    #: Items done (succeeded or failed) per second, from submission to now, or to its last
    #: move once it ended.
    items_per_second: float
    #: Seconds left at the rate so far; ``None`` when that cannot be known.
    eta_seconds: Optional[float]
    #: When it was submitted, in seconds since the Unix epoch.
    submitted_at: float
    #: When it last moved, in seconds since the Unix epoch.
    updated_at: Optional[float]
    #: When a running job last moved, once it has not moved for a minute.
    stalled_since: Optional[float]
    #: Why it failed or was canceled.
    cause: Optional[str]
    #: Where its output file is (or its folder, for ``summary_only``): a path or an
    #: ``s3://`` URL.
    output: str
    #: Where ``failed_items.csv`` is, once the job ended with failed items.
    failed_items: Optional[str]
    #: The whole answer, for fields this class does not name.
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ended(self) -> bool:
        """Whether the job has ended."""
        return isinstance(self.state, JobState) and self.state.ended

    @property
    def completed(self) -> bool:
        """Whether the job ended Completed."""
        return self.state == JobState.COMPLETED

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JobStatus":
        return cls(
            job_id=str(data["job_id"]),
            name=str(data.get("name", "")),
            pool=str(data.get("pool", "")),
            state=_state(str(data["state"])),
            counts=Counts.from_json(data.get("counts") or {}),
            items_per_second=float(data.get("items_per_second") or 0.0),
            eta_seconds=_float(data.get("eta_seconds")),
            submitted_at=float(data.get("submitted_at") or 0.0),
            updated_at=_float(data.get("updated_at")),
            stalled_since=_float(data.get("stalled_since")),
            cause=data.get("cause"),
            output=str(data.get("output", "")),
            failed_items=data.get("failed_items"),
            raw=dict(data),
        )
