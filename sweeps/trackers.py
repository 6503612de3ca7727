"""Experiment trackers of a sweep: Ray Tune's TensorBoard (tensorboardX) and MLflow loggers.

Off by default (creating them imports tensorboardX / MLflow, seconds of CPU). A spec turns
them on with ``trackers: [tensorboard, mlflow]`` or, with options::

    trackers:
      tensorboard: {}                    # event files in <storage>/tensorboard/<trial_id>/
      mlflow:
        tracking_uri: null               # default sqlite:///<storage>/mlflow.db
        experiment_name: null            # default: the sweep's name
        tags: {team: fl}

This module holds the schema and the checks (no Ray, no tracker package imported);
:func:`make_trackers` builds the Tune callbacks of :mod:`sweeps.tracker_tensorboard` and
:mod:`sweeps.tracker_mlflow` for one fit.
"""
from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.results import Storage
from engine.storage.locations import is_uri

# tracker -> (module it needs, distribution that provides it)
PACKAGES = {"tensorboard": ("tensorboardX", "tensorboardX"), "mlflow": ("mlflow", "mlflow-skinny")}
INSTALL = "pip install 'hetsim[trackers]'"
MLFLOW_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file")
MLFLOW_DB = "mlflow.db"  # the default store, in the sweep folder
MLFLOW_ARTIFACTS = "mlartifacts"  # its artifact root (nothing is logged there by the sweep)
TENSORBOARD_DIR = "tensorboard"  # <storage>/tensorboard/<trial_id>/events.out.tfevents.*


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorBoardOptions(_Model):
    """No options: one event folder per trial under ``<storage>/tensorboard/``."""


class MLflowOptions(_Model):
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI (sqlite:///path.db, http(s)://server, ...); "
        "default sqlite:///<storage>/mlflow.db")
    experiment_name: str | None = Field(None, description="default: the sweep's name")
    tags: dict[str, str] = Field(default_factory=dict, description="tags of every trial's run")


class TrackersSpec(_Model):
    """``trackers:`` of a sweep spec: a list of names or a mapping name -> options."""

    tensorboard: TensorBoardOptions | None = None
    mlflow: MLflowOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _list_form(cls, v: Any) -> Any:
        if v is None:
            return {}
        if isinstance(v, str):
            v = [v]
        if isinstance(v, (list, tuple)):
            for name in v:
                if not isinstance(name, str):
                    raise ValueError(f"tracker {name!r} must be a name; allowed: {', '.join(PACKAGES)}")
            return {name: {} for name in v}  # an unknown name is an unknown key: listed with the allowed ones
        return v

    @property
    def names(self) -> list[str]:
        return [name for name in PACKAGES if getattr(self, name) is not None]


def default_mlflow_uri(storage: str) -> str:
    """sqlite:////abs/path/mlflow.db: three slashes, then the absolute path."""
    return "sqlite:///" + Path(storage, MLFLOW_DB).as_posix()


def check_trackers(trackers: TrackersSpec, storage: str) -> None:
    """Raise ``ValueError`` (field, value, what is allowed) for a tracker that cannot run:
    its package is missing, its tracking URI has an unknown scheme, or MLflow has no store."""
    for name in trackers.names:
        module, dist = PACKAGES[name]
        if find_spec(module) is None:
            raise ValueError(f"trackers.{name}: needs the package {dist} ({module} is not installed); "
                             f"install it with {INSTALL}")
    ml = trackers.mlflow
    if ml is None:
        return
    uri = ml.tracking_uri
    if uri is None:
        if is_uri(storage):
            raise ValueError(
                f"trackers.mlflow.tracking_uri = None: the default store sqlite:///<storage>/{MLFLOW_DB} "
                f"needs a local sweep folder, and storage = {storage!r} is a URI; give a tracking_uri "
                "(an MLflow server http(s)://host:5000, or sqlite:////local/path/mlflow.db)")
        return
    # `postgresql+psycopg2://` is postgresql; a bare `databricks` is MLflow's Databricks workspace
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else uri if uri == "databricks" else ""
    if scheme not in MLFLOW_SCHEMES:
        raise ValueError(f"trackers.mlflow.tracking_uri = {uri!r}: unknown scheme {scheme or '(none)'!r}; "
                         f"allowed: {', '.join(s + '://' for s in MLFLOW_SCHEMES)} "
                         "(a local store: sqlite:////absolute/path/mlflow.db)")
    if scheme == "file" and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise ValueError(f"trackers.mlflow.tracking_uri = {uri!r}: MLflow 3 refuses its file store unless "
                         "MLFLOW_ALLOW_FILE_STORE=true is set; use sqlite:///<path>/mlflow.db instead")


def make_trackers(trackers: TrackersSpec, *, storage: Storage, location: str, name: str,
                  param_columns: dict[str, str]) -> list[Any]:
    """The Tune logger callbacks of the spec's trackers, set up for one fit (run or resume).

    ``storage``: the sweep folder as Tune uses it; ``location``: its path or URI as written in
    sweep.yaml (MLflow runs are tagged with it, so a resume finds its own runs)."""
    check_trackers(trackers, location)
    out: list[Any] = []
    if trackers.tensorboard is not None:
        from sweeps.tracker_tensorboard import SweepTensorBoard  # tensorboardX: only when asked for

        out.append(SweepTensorBoard(storage.child(TENSORBOARD_DIR), param_columns))
    if trackers.mlflow is not None:
        from sweeps.tracker_mlflow import SweepMLflow  # mlflow: seconds of imports, only when asked for

        ml = trackers.mlflow
        local = storage.local_path()
        out.append(SweepMLflow(
            tracking_uri=ml.tracking_uri or default_mlflow_uri(location),
            experiment_name=ml.experiment_name or name,
            artifact_location=None if ml.tracking_uri or local is None else str(local / MLFLOW_ARTIFACTS),
            tags={**ml.tags, "sweep": name, "sweep_storage": location},
            param_columns=param_columns,
        ))
    for tracker in out:
        tracker.setup()
    return out
