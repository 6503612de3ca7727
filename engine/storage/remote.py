"""Object storage that does not answer: every remote operation of a
:class:`engine.storage.locations.Storage` on ``s3://`` or ``gs://`` is bounded by
``HETSIM_STORAGE_TIMEOUT_S`` (:func:`bounded`), the filesystems get time-outs of their own
(:func:`timeout_defaults`), and a failure says where, on which filesystem, and the likely cause.
The functions take that ``Storage`` (its ``fs``, ``uri``, ``path``, ``options``) without
importing its module, which imports this one.
"""
from __future__ import annotations

import datetime as dt
import os
import threading
from typing import Any, Callable, TypeVar

import pyarrow.fs as pafs

from engine.errors import ConfigError, UserError


class StorageUnreachable(UserError, OSError):
    """An operation on object storage failed or did not answer in time (network, credentials,
    bucket); the message names the URI, the filesystem and the likely cause."""


TIMEOUT_ENV = "HETSIM_STORAGE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_OPTIONS = ("connect_timeout", "request_timeout", "retry_time_limit")
T = TypeVar("T")


def storage_timeout_s() -> float:
    """The bound of one remote storage operation, seconds (``HETSIM_STORAGE_TIMEOUT_S``)."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None or not text.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{TIMEOUT_ENV} = {text!r}: give a number of seconds > 0 (default "
                           f"{DEFAULT_TIMEOUT_S:g})")
    return value


def timeout_defaults(scheme: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the filesystem's own time-outs filled in (those the user gave are kept;
    a number of seconds for GCS's ``retry_time_limit`` becomes the timedelta pyarrow wants)."""
    limit = storage_timeout_s()
    out = dict(options)
    if scheme in ("s3", "s3a"):
        out.setdefault("connect_timeout", limit / 3)
        out.setdefault("request_timeout", limit / 2)
    elif scheme in ("gs", "gcs"):
        retry = out.get("retry_time_limit", limit / 3)
        out["retry_time_limit"] = retry if isinstance(retry, dt.timedelta) else dt.timedelta(seconds=float(retry))
    return out


def likely_cause(storage: Any, text: str) -> str:
    low = text.lower()
    gcs = isinstance(storage.fs, pafs.GcsFileSystem)
    endpoint = storage.options.get("endpoint_override")
    where = f"endpoint {endpoint}" if endpoint else ("Google Cloud Storage" if gcs else "the S3 endpoint")
    if any(k in low for k in ("credential", "access token", "accessdenied", "access denied", "invalidaccesskeyid",
                              "signaturedoesnotmatch", "forbidden", "unauthorized", "403", "401")):
        how = ("GOOGLE_APPLICATION_CREDENTIALS, or anonymous: true for a public bucket" if gcs else
               "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or access_key / secret_key in storage_options")
        return f"the credentials were missing or refused ({how})"
    if any(k in low for k in ("nosuchbucket", "bucket does not exist", "bucket not found", "404")):
        return f"the bucket {storage.path.split('/')[0]!r} does not exist (or is in another region/project)"
    if any(k in low for k in ("could not connect", "couldn't connect", "connection refused", "curl error",
                              "resolve host", "network", "unreachable", "timed out", "timeout")):
        return f"the network: {where} cannot be reached (no route, firewall or proxy, or a wrong endpoint_override)"
    if not text:  # no answer at all
        return (f"the network or the credentials: {where} did not answer (unreachable, or a credentials "
                "lookup such as a cloud metadata server that never answers)")
    return "the network, the credentials or the bucket"


def bounded(storage: Any, what: str, op: Callable[[], T], watchdog: bool = True) -> T:
    """``op()`` on a remote filesystem, bounded by :func:`storage_timeout_s` (``watchdog``;
    transfers rely on the filesystem's own per-request time-outs). Its errors, but a missing
    file, become a :class:`StorageUnreachable` that says what was done where and why it may
    have failed."""
    if not storage.bounded:
        return op()
    limit = storage.watchdog_s
    fsname = f"pyarrow.fs.{type(storage.fs).__name__}"
    outcome: dict[str, Any] = {}

    def call():
        try:
            outcome["value"] = op()
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread below
            outcome["error"] = err

    if watchdog:
        worker = threading.Thread(target=call, name="hetsim-storage", daemon=True)  # a hung one is left
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            raise StorageUnreachable(
                f"storage {storage.uri} ({fsname}): {what} did not answer within {limit:g} s "
                f"(the bound {TIMEOUT_ENV}={storage_timeout_s():g}); likely cause: {likely_cause(storage, '')}")
    else:
        call()
    err = outcome.get("error")
    if err is None:
        return outcome["value"]
    if isinstance(err, (FileNotFoundError, StorageUnreachable)) or not isinstance(err, Exception):
        raise err
    text = f"{type(err).__name__}: {str(err).strip()[:300]}"
    raise StorageUnreachable(f"storage {storage.uri} ({fsname}): {what} failed ({text}); likely cause: "
                             f"{likely_cause(storage, text)}") from err
