"""What a run's summary says, in one place: ``hetsim run`` prints it at the end, ``hetsim show``
prints it, and the report's first table holds the same lines (docs/results.md, "The summary").

Besides accuracy, traffic and time, a summary names the execution mode (an asynchronous run is
its mode, ``fedbuff`` or ``fedasync``, with the method its clients train with), counts in server
steps where a run has no rounds, and gives the energy ledger's totals, battery drops and the
drops by reason. A value that cannot be given says why (``n/a (...)``), never a bare ``n/a``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from engine.results.manifest import method_label
from hetsim.common import human_bytes

NA = "n/a"


def _num(frame: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(frame[col], errors="coerce") if col in frame else pd.Series(dtype=float)


def _pct(v: float) -> str:
    return f"{100 * v:.2f}%"


def joules(j: float) -> str:
    """``1.23 kJ``; J below 1 kJ, MJ from 1 MJ."""
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(j) >= scale:
            return f"{j / scale:.3g} {unit}"
    return f"{j:.3g} J"


def _async(cfg: dict) -> dict | None:
    a = cfg.get("asynchronous")
    return a if isinstance(a, dict) and a.get("mode") else None


def method_text(cfg: dict, manifest: dict) -> str:
    """``fedavg (synchronous rounds)``, or ``fedbuff: asynchronous, clients train with fedavg
    (buffer 4, 8 in flight)``."""
    algo = (cfg.get("algorithm") or {}).get("name") or manifest.get("algorithm", "?")
    a = _async(cfg)
    if a is None:
        return f"{algo} (synchronous rounds)"
    mode = a["mode"]
    buffer = f"buffer {a.get('buffer_size')}, " if mode == "fedbuff" else "one update per step, "
    return (f"{method_label(algo, mode)}: asynchronous, clients train with {algo} "
            f"({buffer}{a.get('concurrency')} in flight)")


def steps_text(cfg: dict, done: int) -> tuple[str, str]:
    """(label, value) of how far the run got: rounds, or server steps for an asynchronous run."""
    of = f" of {cfg['rounds']}" if cfg.get("rounds") is not None else ""
    if _async(cfg) is None:
        return "rounds", f"{done}{of}"
    return "server steps", f"{done}{of} (asynchronous: `rounds` counts server steps, not rounds)"


def _evaluation(cfg: dict) -> dict:
    return cfg.get("evaluation") or {}


def accuracy_text(rounds: pd.DataFrame, cfg: dict, col: str) -> tuple[str, str]:
    """(final, best) of ``global_acc`` or ``pers_acc``; each ``n/a (why)`` when there is no value."""
    values = _num(rounds, col).dropna()
    if len(values):
        return _pct(float(values.iloc[-1])), _pct(float(values.max()))
    why = f"{NA} ({why_no_accuracy(rounds, cfg, col)})"
    return why, why


def why_no_accuracy(rounds: pd.DataFrame, cfg: dict, col: str) -> str:
    """Why a run has no value of ``col`` (``global_acc``, or ``pers_acc`` and its variants)."""
    ev = _evaluation(cfg)
    if col == "global_acc":
        if ev.get("global_model") is False:
            return "evaluation.global_model: false"
    else:
        if _async(cfg) is not None:
            return "asynchronous runs evaluate the global model only: clients are not evaluated while dispatched"
        if ev.get("personalized") is False:
            return "evaluation.personalized: false"
    if col not in rounds:
        return f"rounds.parquet has no {col} column"
    every = ev.get("eval_every", 1)
    if len(rounds) and every > 1 and len(rounds) < every:
        return f"no round evaluated yet: evaluation.eval_every = {every}"
    if col == "pers_acc":
        return "no client that ran was evaluated (every evaluated round's clients dropped)"
    return "no round evaluated yet"


def personalized_text(rounds: pd.DataFrame, cfg: dict) -> str:
    """The last evaluated round's mean personalized accuracy, with its weighted mean and worst
    client; ``n/a (why)`` when no round has one."""
    final, _ = accuracy_text(rounds, cfg, "pers_acc")
    if final.startswith(NA):
        return final
    last = rounds.loc[_num(rounds, "pers_acc").dropna().index[-1]]
    extra = [f", {_pct(float(last[col]))} {label}" for col, label in
             (("pers_acc_weighted", "weighted"), ("pers_acc_worst", "worst client"))
             if col in last and pd.notna(last[col])]
    return f"{final} mean" + "".join(extra)


def energy_rows(run) -> list[tuple[str, str]]:
    """Fleet energy and energy per client from the ledger (J), and battery drops."""
    r, c = run.rounds, run.clients
    why = why_no_energy(r)
    if why:
        rows = [("energy", f"{NA} ({why})")]
    else:
        total = float(_num(r, "energy_j").sum())
        wasted = float(_num(r, "energy_wasted_j").sum())
        share = f", {100 * wasted / total:.1f} % on updates not aggregated" if total > 0 else ""
        rows = [("energy (fleet total)", f"{joules(total)}{share}")]
        ran = c.assign(e=_num(c, "energy_j")).dropna(subset=["e"]) if "energy_j" in c else c.iloc[:0]
        if len(ran):
            per = ran.groupby("client_id")["e"].sum()
            rows.append(("energy per client", f"mean {joules(per.mean())}, max {joules(per.max())} "
                         f"(client {int(per.idxmax())}), {len(per)} clients ran"))
    rows.append(("battery drops", battery_text(run)))
    return rows


def why_no_energy(rounds: pd.DataFrame) -> str | None:
    """Why a run's fleet energy cannot be given; None when it can. A sum over the known rounds
    would pass for the whole run's, so one unknown round makes the total unknown."""
    if "energy_j" not in rounds:
        return "run written before the energy ledger: no energy columns"
    unknown = int(_num(rounds, "energy_j").isna().sum())
    if unknown:
        return (f"{unknown} of {len(rounds)} rounds include a client whose tier has no power model, "
                "so their energy is unknown; docs/energy.md")
    return None


def battery_text(run) -> str:
    profiles = (run.config or {}).get("clients", {}).get("profiles", {}) or {}
    if "num_battery" not in run.rounds:
        if not profiles.get("battery"):
            return f"{NA} (no batteries: clients.profiles.battery is not set)"
        return f"{NA} (rounds.parquet has no num_battery column)"
    n = int(_num(run.rounds, "num_battery").sum())
    low = _num(run.rounds, "battery_min").dropna()
    lowest = f"; lowest level {100 * float(low.min()):.0f} %" if len(low) else ""
    return f"{n} client-rounds selected but out of charge{lowest}"


def drop_rows(run) -> list[tuple[str, str]]:
    """How many of the selected (dispatched) clients' updates were not aggregated, by reason."""
    c = run.clients
    word = "dispatched" if _async(run.config or {}) is not None else "selected"
    if c.empty or "drop_reason" not in c:
        return [("dropped", f"{NA} (clients.parquet has no rows)")]
    reasons = c["drop_reason"].fillna("").astype(str)
    counts = reasons[reasons != ""].value_counts()
    if counts.empty:
        return [("dropped", f"none of {len(c)} {word} client-rounds")]
    by = ", ".join(f"{reason} {n}" for reason, n in counts.items())
    return [("dropped", f"{int(counts.sum())} of {len(c)} {word} client-rounds: {by}")]


def summary_rows(run) -> list[tuple[str, str]]:
    """The lines every summary shows, (label, value), from a loaded run (engine.results.Run)."""
    cfg, m, r = run.config or {}, run.manifest, run.rounds
    dataset = (cfg.get("dataset") or {}).get("name") or m.get("dataset", "?")
    model = (cfg.get("model") or {}).get("name")
    g_final, g_best = accuracy_text(r, cfg, "global_acc")
    rows = [
        ("method", method_text(cfg, m)),
        ("dataset / model", f"{dataset} / {model}" if model else dataset),
        steps_text(cfg, len(r)),
    ]
    if (cfg.get("clock") or {}).get("mode") == "timing_only":  # no accuracy to give, and no why per line
        rows.append(("training", "none: clock.mode = timing_only (the clock, from the model's FLOPs and the "
                                 "method's wire format)"))
    else:
        rows += [("global accuracy (final)", g_final), ("global accuracy (best)", g_best),
                 ("personalized acc (final)", personalized_text(r, cfg))]
    rows += [
        ("upload / download", f"{human_bytes(_num(r, 'bytes_up').sum())} / {human_bytes(_num(r, 'bytes_down').sum())}"),
        *drop_rows(run),
        *energy_rows(run),
        ("simulated time", f"{float(r['sim_time_s'].iloc[-1]):.1f} s"),
        ("wall time", wall_text(m, r)),
    ]
    return rows


def wall_text(m: dict, r) -> str:
    """The run's wall time: from the command's start when the manifest has it (``command_wall_s``,
    which counts the validation, a Ray's and its actors' start-up), with the start-up apart;
    else the run body's (``wall_s``), else the rounds'."""
    wall = m.get("wall_s", float(_num(r, "wall_s").sum()) if "wall_s" in r else math.nan)
    if not isinstance(wall, (int, float)) or not np.isfinite(wall):
        return f"{NA} (no finished round recorded its wall time)"
    total = m.get("command_wall_s")
    if not isinstance(total, (int, float)) or not np.isfinite(total) or total < wall:
        return f"{wall:.1f} s"
    ray = " and Ray's" if (m.get("executor") or {}).get("kind") == "ray" else ""
    return (f"{total:.1f} s from the command's start: start-up {total - wall:.1f} s (validation{ray} start), "
            f"then the run {wall:.1f} s")


def format_rows(rows: list[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
