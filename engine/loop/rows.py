"""The rows a round writes: its rounds.parquet row and its clients.parquet rows.

Column layout lives here (documented in docs/results.md); the loop hands over what happened.
Global evaluation (:mod:`engine.loop.evaluation`) fills the ``global_*`` columns this module
reserves, so their place in the table does not depend on when they are computed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from algorithms.base import Broadcast, ClientResult
from hardware_profiles.energy import ENERGY_COLUMNS

PERSONALIZED_COLUMNS = ("pers_acc", "pers_acc_weighted", "pers_acc_worst", "pers_acc_std", "pers_loss")


def payloads(broadcast: Broadcast, results: list[ClientResult]) -> dict[str, np.ndarray]:
    """Per result: bytes down (its architecture's broadcast, or the part it read:
    ``ClientResult.download_nbytes``) and up, training FLOPs and compression ops (float64)."""
    return {
        "bytes_down": np.array([broadcast[res.arch].nbytes if res.download_nbytes is None else res.download_nbytes
                                for res in results], dtype=np.float64),
        "bytes_up": np.array([res.upload.nbytes for res in results], dtype=np.float64),
        "train_flops": np.array([res.train_flops for res in results], dtype=np.float64),
        "compress_ops": np.array([res.compress_ops for res in results], dtype=np.float64),
    }


TIMELINE_COLUMNS = ("download_end_s", "train_end_s", "compress_end_s", "upload_end_s")
CONDITION_COLUMNS = ("down_mbps", "up_mbps", "down_state", "up_state", "left_s")  # fleets with conditions only


def clock_row(r: int, *, num_selected: int, num_run: int, num_arrived: int, available, dropped, round_s: float,
              sim_time_s: float, deadline_s: float | None, bytes_up: int, bytes_down) -> dict[str, Any]:
    """The clock's columns of a rounds.parquet row (a ``clock.mode: timing_only`` row is these, the
    energy and ``round_start_s``)."""
    return {
        "round": r,
        "num_selected": num_selected,
        "num_run": num_run,
        "num_arrived": num_arrived,
        "num_unavailable": int((~available).sum()),
        "num_dropout": int((available & dropped).sum()),
        "sim_round_s": round_s,
        "sim_time_s": sim_time_s,
        "sim_deadline_s": float("nan") if deadline_s is None else float(deadline_s),
        "bytes_up": bytes_up,
        "bytes_down": int(bytes_down.sum()),
    }


def round_row(r: int, *, selected, runnable, arrived: list[ClientResult], available, dropped,
              round_s: float, sim_time_s: float, bytes_down, nonfinite, personalized: list[ClientResult],
              global_columns: list[str], server_metrics: dict[str, Any], start_s: float,
              deadline_s: float | None = None, metrics: tuple[str, ...] = ()) -> dict[str, Any]:
    """The rounds.parquet row, without ``wall_s`` (the loop adds it last). ``personalized``: the
    results whose personalized metrics count this round ([] when it is no evaluation round);
    ``global_columns``: the ``global_*`` columns reserved for global evaluation (NaN until set);
    ``deadline_s``: the round's deadline (None: none); ``metrics``: the registered metrics evaluated
    (``evaluation.metrics``)."""
    row = clock_row(r, num_selected=len(selected), num_run=len(runnable), num_arrived=len(arrived),
                    available=available, dropped=dropped, round_s=round_s, sim_time_s=sim_time_s,
                    deadline_s=deadline_s, bytes_up=int(sum(res.upload.nbytes for res in arrived)),
                    bytes_down=bytes_down)
    row["train_loss"] = _mean([res.metrics.get("train_loss") for res in arrived])
    row["num_nonfinite"] = int(nonfinite.sum())
    row.update(personalized_summary(personalized, metrics))
    row.update({name: float("nan") for name in global_columns})
    row.update({f"server_{k}": v for k, v in server_metrics.items()})
    row["round_start_s"] = start_s
    return row


def step_row(r: int, resolved: list[dict[str, Any]], applied: list[ClientResult], dispatched: list[tuple[int, float]],
             nonfinite, *, start_s: float, now: float, clock_start_s: float, global_columns: list[str],
             server_metrics: dict[str, Any], deadline_s: float | None, metrics: tuple[str, ...], version: int,
             in_flight: int, buffered: int, batteries) -> dict[str, Any]:
    """An asynchronous server step's rounds.parquet row, without ``wall_s``: a round's columns over
    the step (``dispatched``: (client, bytes down) of the tasks dispatched since the last step;
    ``resolved``: the clients.parquet rows of the updates applied or dropped in it; ``applied``:
    its updates), the version, the drops by reason, what is in flight and buffered, staleness."""
    n = len(dispatched)
    row = round_row(r, selected=np.zeros(n), runnable=np.zeros(n), arrived=applied,
                    available=np.ones(n, dtype=bool), dropped=np.zeros(n, dtype=bool), round_s=now - start_s,
                    sim_time_s=now - clock_start_s, bytes_down=np.array([b for _, b in dispatched], dtype=np.float64),
                    nonfinite=nonfinite, personalized=[], global_columns=global_columns,
                    server_metrics=server_metrics, start_s=start_s, deadline_s=deadline_s, metrics=metrics)
    for name in ENERGY_COLUMNS:
        row[name] = float(sum(u[name] for u in resolved))
    row["energy_wasted_j"] = float(sum(u["energy_j"] for u in resolved if not u["made_deadline"]))
    reasons = [u["drop_reason"] for u in resolved]
    tau = np.array([u["staleness"] for u in resolved if u["made_deadline"]], dtype=np.float64)  # the applied
    row.update(version=version, num_stale=reasons.count("stale"), num_offline=reasons.count("offline"),
               num_deadline=reasons.count("deadline"), in_flight=in_flight, buffered=buffered,
               staleness_mean=float(tau.mean()), staleness_max=int(tau.max()))
    if batteries is not None:  # as a round's (energy_summary): drops, the fleet's levels
        levels = batteries.level[batteries.has] / batteries.capacity[batteries.has]
        row.update(num_battery=reasons.count("battery"), battery_mean=float(levels.mean()),
                   battery_min=float(levels.min()))
    return row


def client_rows(r: int, profiles, selected, not_run, results: list[ClientResult], times,
                bytes_down, outcome, timeline: dict[str, np.ndarray], start_s: float,
                energy: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The clients.parquet rows of a round: one per selected client, in id order. ``not_run``:
    per selected client, the drop reason if it did not run (unavailable, battery, dropout)."""
    by_id = {res.client_id: i for i, res in enumerate(results)}
    prof = profiles
    rows = []
    for sel_pos, cid in enumerate(selected.tolist()):
        row: dict[str, Any] = {
            "round": r,
            "client_id": cid,
            "tier": prof.tier[cid],
            "net_tier": prof.net_tier[cid],
        }
        i = by_id.get(cid)
        if i is None:
            row["made_deadline"] = False
            row["drop_reason"] = str(not_run[sel_pos])
            rows.append(row)
            continue
        res: ClientResult = results[i]
        row.update(
            {
                "arch": res.arch,
                "num_samples": res.num_samples,
                "bytes_up": res.upload.nbytes,
                "bytes_down": int(bytes_down[i]),
                "train_flops": res.train_flops,
                "compress_ops": res.compress_ops,
                "sim_download_s": times["download_s"][i],
                "sim_compute_s": times["compute_s"][i],
                "sim_compress_s": times["compress_s"][i],
                "sim_upload_s": times["upload_s"][i],
                "sim_total_s": times["total_s"][i],
                "made_deadline": bool(outcome.made_deadline[i]),
                "drop_reason": outcome.drop_reason[i],
            }
        )
        row.update(res.metrics)
        for name in ENERGY_COLUMNS:
            row[name] = float(energy[name][i])
        row["start_s"] = start_s
        for name in TIMELINE_COLUMNS:
            row[name] = float(timeline[name][i])
        for name in CONDITION_COLUMNS:
            if name in timeline:
                value = timeline[name][i]
                row[name] = value if isinstance(value, str) else float(value)
        rows.append(row)
    return rows


def add_selection_columns(client_rows: list[dict[str, Any]], selection) -> None:
    """A selection policy's ``score`` / ``reason`` per selected client (rows in selection order)."""
    for column, values in (("selection_score", selection.score), ("selection_reason", selection.reason)):
        if values is None:
            continue
        for i, row in enumerate(client_rows):
            row[column] = values if isinstance(values, str) else (
                float(values[i]) if column == "selection_score" else str(values[i]))


def client_columns(r: int, profiles, selected, not_run, run_mask, arch, sent: dict[str, np.ndarray],
                   num_samples, times, outcome, timeline: dict[str, np.ndarray], start_s: float,
                   energy: dict[str, np.ndarray], battery: dict[str, np.ndarray] | None = None, selection=None,
                   extra: dict[str, np.ndarray] | None = None):
    """The clients.parquet rows of a round as one Arrow table, without a Python loop over the
    clients (``clock.mode: timing_only``): the columns :func:`client_rows` writes, with the same
    values and types, but no training metrics. Arrays over the runnable clients (``sent``,
    ``num_samples``, ``times``, ``outcome``, ``timeline``, ``energy``, ``arch``, and the integer
    columns ``extra``, e.g. a work policy's ``local_steps``) are placed at ``run_mask`` among the
    selected ones; elsewhere they are null, as a row without the key."""
    import pyarrow as pa  # the round loop of a full run never needs it here (its rows are dicts)

    n, ran = len(selected), np.asarray(run_mask, dtype=bool)
    hole = ~ran

    def spread(values, kind):
        out = np.zeros(n, dtype=kind)
        out[ran] = values
        return pa.array(out, mask=hole)

    def spread_text(values):
        out = np.full(n, None, dtype=object)
        out[ran] = values
        return pa.array(out, type=pa.string())

    reason = np.asarray(not_run, dtype=object).copy()
    reason[ran] = outcome.drop_reason
    made = np.zeros(n, dtype=bool)
    made[ran] = outcome.made_deadline
    cols: dict[str, Any] = {
        "round": pa.array(np.full(n, r, dtype=np.int64)),
        "client_id": pa.array(np.asarray(selected, dtype=np.int64)),
        "tier": pa.array(profiles.tier[selected], type=pa.string()),
        "net_tier": pa.array(profiles.net_tier[selected], type=pa.string()),
        "arch": spread_text(arch),
        "num_samples": spread(num_samples, np.int64),
        "bytes_up": spread(sent["bytes_up"], np.int64),
        "bytes_down": spread(sent["bytes_down"], np.int64),
        "train_flops": spread(sent["train_flops"], np.float64),
        "compress_ops": spread(sent["compress_ops"], np.float64),
        **{f"sim_{k}": spread(times[k], np.float64)
           for k in ("download_s", "compute_s", "compress_s", "upload_s", "total_s")},
        "made_deadline": pa.array(made),
        "drop_reason": pa.array(reason, type=pa.string()),
        **{name: spread(energy[name], np.float64) for name in ENERGY_COLUMNS},
        "start_s": spread(np.full(int(ran.sum()), start_s), np.float64),
        **{name: spread(timeline[name], np.float64) for name in TIMELINE_COLUMNS},
    }
    for name in CONDITION_COLUMNS:
        if name in timeline:
            value = np.asarray(timeline[name])
            cols[name] = spread_text(value) if value.dtype.kind in "OU" else spread(value, np.float64)
    for name, value in (extra or {}).items():
        cols[name] = spread(value, np.int64)
    for name, value in (battery or {}).items():
        cols[name] = pa.array(value)
    if selection is not None and selection.score is not None:  # the selection policy's, as add_selection_columns
        cols["selection_score"] = pa.array(np.asarray(selection.score, dtype=np.float64))
    if selection is not None and selection.reason is not None:
        reason = selection.reason
        cols["selection_reason"] = pa.array([reason] * n if isinstance(reason, str) else [str(x) for x in reason],
                                            type=pa.string())
    return pa.table(cols)


def energy_summary(energy: dict[str, np.ndarray], outcome, low, batteries) -> dict[str, Any]:
    """The round's fleet energy (J; NaN when a client's power model is unknown), the part spent
    by clients whose update was not aggregated, and with batteries: drops for lack of charge and
    the fleet's battery levels (fractions of capacity) at the round's end."""
    out: dict[str, Any] = {name: float(energy[name].sum()) for name in ENERGY_COLUMNS}
    out["energy_wasted_j"] = float(energy["energy_j"][~outcome.made_deadline].sum())
    if batteries is not None:
        out["num_battery"] = int(low.sum() + (outcome.drop_reason == "battery").sum())
        levels = batteries.level[batteries.has] / batteries.capacity[batteries.has]
        out["battery_mean"] = float(levels.mean())
        out["battery_min"] = float(levels.min())
    return out


def add_battery_columns(client_rows: list[dict[str, Any]], level_start, level_end, charging) -> None:
    """Battery level (fraction of capacity; NaN: mains-powered) at the round's start and end,
    and whether the client was on its charger, on each selected client's row (id order)."""
    for row, start, end, on in zip(client_rows, level_start.tolist(), level_end.tolist(), charging.tolist()):
        row["battery_level"] = start
        row["battery_level_end"] = end
        row["on_charger"] = bool(on)


def _mean(values) -> float:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else float("nan")


def personalized_summary(results: list[ClientResult], metrics: tuple[str, ...] = ()) -> dict[str, float]:
    """Personalized accuracy over the clients that evaluated (unweighted, sample-weighted,
    worst, spread), their mean loss and the mean of each registered metric (``pers_<name>``);
    NaN when none did."""
    accs = np.array([r.metrics["pers_acc"] for r in results if "pers_acc" in r.metrics], dtype=float)
    ns = np.array([r.metrics["test_samples"] for r in results if "pers_acc" in r.metrics], dtype=float)
    losses = [r.metrics["pers_loss"] for r in results if "pers_loss" in r.metrics]
    nan = float("nan")
    if len(accs) == 0 or ns.sum() == 0:
        return {k: nan for k in (*PERSONALIZED_COLUMNS, *(f"pers_{m}" for m in metrics))}
    out = {
        "pers_acc": float(np.nanmean(accs)),
        "pers_acc_weighted": float(np.nansum(accs * ns) / ns.sum()),
        "pers_acc_worst": float(np.nanmin(accs)),
        "pers_acc_std": float(np.nanstd(accs)),
        "pers_loss": float(np.mean(losses)),
    }
    for m in metrics:
        values = np.array([r.metrics.get(f"pers_{m}", nan) for r in results], dtype=float)
        out[f"pers_{m}"] = float(np.nanmean(values)) if np.isfinite(values).any() else nan
    return out
