"""The asynchronous loop's record of one dispatched client (:class:`Update`), and its checkpoint
form: plain values, as the checkpoint codec takes no unregistered dataclasses."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from algorithms.base import ClientResult, Payload


@dataclass(eq=False)
class Update:
    """One dispatched client, from dispatch until the server applies or drops its update."""

    seq: int  # dispatch sequence number (the tie-break after the client id)
    wave: int
    client_id: int
    base: int  # the model version it trained from
    dispatch_s: float
    event_s: float  # when the server hears of it: its arrival, or when it went offline
    lost: bool  # offline before its upload was done
    result: ClientResult
    row: dict[str, Any]  # its clients.parquet row, completed when it is resolved
    nonfinite: bool
    lost_reason: str = "offline"  # why it is lost (lost): offline, battery (ran empty) or deadline


def update_state(u: Update) -> dict[str, Any]:
    res = u.result
    out = {f.name: getattr(u, f.name) for f in fields(Update) if f.name != "result"}
    out["row"] = _plain(u.row)
    out["result"] = {f.name: getattr(res, f.name) for f in fields(ClientResult) if f.name != "upload"}
    out["result"]["metrics"] = _plain(res.metrics)
    out["upload"] = {"arrays": res.upload.arrays, "nbytes": res.upload.nbytes, "meta": res.upload.meta}
    return out


def update_of(state: dict[str, Any]) -> Update:
    state = dict(state)
    result = ClientResult(**state.pop("result"), upload=Payload(**state.pop("upload")))
    return Update(**state, result=result)


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """numpy scalars as Python values (exact; the codec cannot store an empty numpy string)."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in row.items()}
