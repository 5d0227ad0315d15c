"""The client of ``fleetrun serve``'s HTTP API: submit, follow and cancel jobs."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

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
from ._jobfile import JobLike, load_job
from ._status import JobState, JobStatus

__all__ = ["Client", "Job"]

#: The variable ``fleetrun serve`` reads its bearer token from; the client's default token.
TOKEN_VAR = "FLEETRUN_API_TOKEN"

# The statuses that say what was wrong with the request, by the exception they raise.
_ERRORS = {400: BadJob, 401: Unauthorized, 404: NotFound, 409: Conflict, 422: BadJob}


class Client:
    """A client of ``fleetrun serve`` at ``url`` (e.g. ``http://127.0.0.1:8080``).

    ``token`` is the API's bearer token (default: ``$FLEETRUN_API_TOKEN``, when set); it is
    sent in the ``Authorization`` header and never shown. ``timeout`` bounds each request, in
    seconds. A request that cannot reach the server (refused, reset, timed out) is tried
    again, ``retries`` times with a growing pause, only where repeating it changes nothing:
    reads, and a submission under its own ``job_id`` (the API attaches a repeated one).

    >>> client = Client("http://127.0.0.1:8080", token="...")      # doctest: +SKIP
    >>> job = client.submit("job.toml", job_id="nightly-2024-06-11") # doctest: +SKIP
    >>> job.wait(timeout=3600).counts.succeeded_items                # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token if token is not None else os.environ.get(TOKEN_VAR) or None
        self.timeout = timeout
        self.retries = retries

    def __repr__(self) -> str:
        return f"Client({self.url!r}, token={'<set>' if self._token else None})"

    # --- the API ---------------------------------------------------------------------

    def submit(
        self,
        job: JobLike,
        job_id: Optional[str] = None,
        *,
        pipeline_job: Optional[str] = None,
    ) -> "Job":
        """Submits ``job`` and returns it as a :class:`Job`.

        ``job`` is a dict of a job file's fields (relative paths taken from the current
        folder), the path of a job file (TOML; its relative paths taken from its folder), or
        an Azure ML v2 YAML's path or text (``pipeline_job`` names the parallel job of a
        pipeline that has several). The server must see the job's local paths; code, input
        and output may be ``s3://`` URLs.

        With ``job_id``, submitting is idempotent: the same job under the same id attaches to
        it (``Job.attached``) rather than submitting it twice, and another job under that id
        raises :class:`Conflict`. Without, the server makes an id from the name and the time.
        A job that does not validate raises :class:`BadJob` with the one-line reason.
        """
        body: Dict[str, Any] = {"job": load_job(job, pipeline_job)}
        if job_id is not None:
            body["job_id"] = job_id
        answer = self._call("POST", "/v1/jobs", body, idempotent=job_id is not None)
        return Job(self, str(answer["job_id"]), attached=bool(answer.get("attached")))

    def job(self, job_id: str) -> "Job":
        """The job ``job_id``, submitted here or elsewhere; :class:`NotFound` when there is
        none."""
        job = Job(self, job_id)
        job.status()
        return job

    def jobs(self) -> List[JobStatus]:
        """The jobs of the pool the server serves: running ones, and ended ones for a week."""
        return [JobStatus.from_json(j) for j in self._call("GET", "/v1/jobs")]

    def status(self, job_id: str) -> JobStatus:
        """Job ``job_id``'s status (see :meth:`Job.status`)."""
        return JobStatus.from_json(self._call("GET", f"/v1/jobs/{_quote(job_id)}"))

    def cancel(self, job_id: str) -> JobStatus:
        """Cancels job ``job_id`` (see :meth:`Job.cancel`)."""
        path = f"/v1/jobs/{_quote(job_id)}/cancel"
        return JobStatus.from_json(self._call("POST", path, idempotent=False))

    def healthy(self) -> bool:
        """Whether the server answers and its ledger and broker do (``/healthz``)."""
        try:
            self._call("GET", "/healthz")
        except (Unavailable, ApiError):
            return False
        return True

    # --- HTTP ------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, *, idempotent: bool = True) -> Any:
        """The JSON answer to one request, errors raised as this package's exceptions."""
        attempts = 1 + (self.retries if idempotent else 0)
        for attempt in range(attempts):
            try:
                status, data = self._send(method, path, body)
            except _CannotReach as e:
                if attempt + 1 < attempts:
                    time.sleep(min(0.5 * 2**attempt, 5.0))
                    continue
                raise Unavailable(0, f"{method} {self.url}{path}: {e}") from e.__cause__
            if status < 400:
                return data
            message = data.get("error") if isinstance(data, dict) else None
            message = message or f"{method} {path} answered {status}"
            raise _ERRORS.get(status, Unavailable if status >= 500 else ApiError)(status, message)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, method: str, path: str, body: Any) -> Tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.status, _json(answer.read())
        except urllib.error.HTTPError as e:
            with e:
                return e.code, _json(e.read())
        except urllib.error.URLError as e:
            raise _CannotReach(str(e.reason)) from e
        except (ConnectionError, socket.timeout, http.client.HTTPException) as e:
            raise _CannotReach(str(e) or type(e).__name__) from e


class Job:
    """A job on the fleet, by its id: :meth:`status`, :meth:`wait`, :meth:`cancel`.

    ``attached`` is true when :meth:`Client.submit` found the job already submitted under
    its id, with the same job.
    """

    def __init__(self, client: Client, job_id: str, *, attached: bool = False) -> None:
        self.client = client
        self.id = job_id
        self.attached = attached

    def __repr__(self) -> str:
        return f"Job({self.id!r}, attached={self.attached})"

    def status(self) -> JobStatus:
        """The job's state, counts, rate, ETA, output locations and cause, now."""
        return self.client.status(self.id)

    def wait(
        self,
        timeout: Optional[float] = None,
        *,
        raise_on_failure: bool = True,
        poll: float = 2.0,
    ) -> JobStatus:
        """Waits for the job to end and returns its last status.

        Raises :class:`JobEnded` when it ended Failed, Canceled or Expired (unless
        ``raise_on_failure`` is false: then that status is returned), and
        :class:`WaitTimeout` when ``timeout`` seconds pass first. The status is read every
        ``poll`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status.ended:
                if raise_on_failure and status.state != JobState.COMPLETED:
                    raise JobEnded(status)
                return status
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(status, timeout or 0.0)
                time.sleep(min(poll, left))
            else:
                time.sleep(poll)

    def cancel(self) -> JobStatus:
        """Cancels the job: workers drop its remaining mini-batches. Returns its status
        after."""
        return self.client.cancel(self.id)


class _CannotReach(FleetrunError):
    """The server could not be reached: the one error a repeated idempotent call may cure."""


def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"error": raw.decode("utf-8", "replace").strip()[:500]}
