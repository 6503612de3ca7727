"""Every client's conditions over virtual time (the ``clients.profiles.conditions`` section,
:mod:`hardware_profiles.condition_spec`) and the round's timeline they give it.

:meth:`FleetConditions.timeline` places a round's phases back to back from its start ``S_r``:
download (after the latency), train, compress, upload (after the latency), each through its
process, exactly (:func:`~hardware_profiles.processes.finish_times`). Clients of sets without
processes keep today's closed-form durations to the bit.
"""
from __future__ import annotations

import numpy as np

from .clock import OPS_TO_FLOPS, client_uniforms, draw_availability, draw_participation
from .condition_spec import Bernoulli, ConditionsSpec, Constant, DiurnalSpec, Markov, Uniform
from .processes import ConstantRates, Diurnal, Intervals, MarkovRates, TraceRates, finish_times
from .sampler import _mix_labels
from .traces import pick, read_interval_traces, read_rate_traces

SALTS = {"down": 0x71D0, "up": 0x71D1, "compute": 0x71D2, "availability": 0x71D3}
SALT_SETS = 0x71D4


def participation(conditions: "FleetConditions | None", profiles, ids, seed: int, round: int, policy,
                  start_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(available, dropped, leaves) of a round's selected clients: today's draws
    (:func:`~hardware_profiles.clock.draw_participation`), with each set's availability process
    in place of the coin, and the virtual time each client leaves (inf: it stays)."""
    available, dropped = draw_participation(profiles, ids, seed, round, policy)
    leaves = np.full(len(available), np.inf)
    if conditions is not None and policy.apply_availability:
        available, leaves = conditions.online(ids, start_s, round, available)
    return available, dropped, leaves


def online_at(conditions: "FleetConditions | None", profiles, ids, seed: int, round: int, policy,
              start_s: float) -> np.ndarray:
    """Who of ``ids`` is online at ``start_s``: :func:`participation`'s first answer, without
    drawing the dropout coins (asked for a fleet's every battery each round)."""
    available = (draw_availability(profiles, ids, seed, round) if policy.apply_availability
                 else np.ones(len(ids), dtype=bool))
    if conditions is not None and policy.apply_availability:
        available, _ = conditions.online(ids, start_s, round, available)
    return available


class FleetConditions:
    """Every client's processes, built once from the spec, the profiles and the seed."""

    def __init__(self, spec: ConditionsSpec, profiles, seed: int, origin_s: float = 0.0):
        self.origin = float(origin_s)  # the run's start: Markov chains step from it
        n = len(profiles)
        names = list(spec.sets)
        if len(names) == 1 and spec.sets[names[0]].share is None:
            labels = np.full(n, names[0], dtype=object)
        else:
            labels = _mix_labels({k: spec.sets[k].share for k in names}, n, seed, SALT_SETS)
        for cid, name in spec.condition_of.items():
            if not 0 <= cid < n:
                raise ValueError(f"condition_of: client id {cid} out of range [0, {n})")
            labels[cid] = name
        self.labels, self.names, self.sets, self.seed = labels, names, spec.sets, int(seed)
        self.code = np.zeros(n, dtype=np.int64)
        for i, name in enumerate(names):  # a loop over sets, not clients
            self.code[labels == name] = i
        self.profiles = profiles
        self.down = {i: self._rates(s.down, "down", i) for i, s in enumerate(spec.sets.values())}
        self.up = {i: self._rates(s.up, "up", i) for i, s in enumerate(spec.sets.values())}
        self.compute = {i: self._rates(s.compute, "compute", i) for i, s in enumerate(spec.sets.values())}
        self.availability = {i: self._availability(s.availability, i) for i, s in enumerate(spec.sets.values())}
        self.varies = np.array([s.varies for s in spec.sets.values()], dtype=bool)

    def columns(self) -> dict[str, np.ndarray]:
        """What profiles.parquet records of every client's conditions: its set, and for each
        replayed process the trace and offset it follows (diurnal: its time zone)."""
        out: dict[str, np.ndarray] = {"conditions": self.labels}
        for kind, processes in (("down", self.down), ("up", self.up), ("compute", self.compute),
                                ("availability", self.availability)):
            trace = np.full(len(self.labels), "", dtype=object)
            offset = np.full(len(self.labels), np.nan)
            zone = np.full(len(self.labels), np.nan)
            for i, process in processes.items():
                members = self._members(i)
                if isinstance(process, (TraceRates, Intervals)):
                    trace[members] = np.asarray(process.trace_names, dtype=object)[process.trace_of[members]]
                    offset[members] = process.offset[members]
                elif isinstance(process, Diurnal):
                    zone[members] = process.tz[members]
            if (trace != "").any():
                out[f"{kind}_trace"], out[f"{kind}_offset_s"] = trace, offset
            if np.isfinite(zone).any():
                out["tz_offset_h"] = zone
        return out

    # ------------------------------------------------------------------ building
    def _members(self, i: int) -> np.ndarray:
        return np.flatnonzero(self.code == i)

    def _unit_scale(self, kind: str, unit: str) -> np.ndarray:
        p, n = self.profiles, len(self.profiles)
        if kind == "compute":
            return p.gflops * 1e9
        if unit == "mbps":
            return np.full(n, 1e6)
        return (p.down_mbps if kind == "down" else p.up_mbps) * 1e6

    def _rates(self, spec, kind: str, i: int):
        p = self.profiles
        if isinstance(spec, Constant):
            base = {"down": p.down_mbps * 1e6, "up": p.up_mbps * 1e6, "compute": p.gflops * 1e9}[kind]
            return ConstantRates(base)
        scale = self._unit_scale(kind, spec.unit)
        salt = SALTS[kind] + 16 * i
        if isinstance(spec, Markov):
            return MarkovRates(list(spec.states.values()), spec.transition, spec.start_vector(), spec.slot_s,
                               scale, self.seed, salt, list(spec.states), origin_s=self.origin)
        column = {"down": "down_mbps", "up": "up_mbps", "compute": "factor"}[kind]
        found = read_rate_traces(spec.file, column)
        return self._traces(found, spec, kind, i, salt,
                            lambda ids, times, values, of, off: TraceRates(times, values, of, off, spec.loop, scale))

    def _traces(self, found, spec, kind, i, salt, make):
        members = self._members(i)
        trace_of = np.zeros(len(self.profiles), dtype=np.int64)
        if spec.traces == "by_client":  # client c follows trace "c"
            missing = [int(c) for c in members if str(int(c)) not in found]
            if missing:
                raise ValueError(f"conditions.{self.names[i]}.{kind}.traces = by_client: {spec.file} has no "
                                 f"trace for clients {missing[:10]} (trace ids are client ids)")
            order = [str(int(c)) for c in members] or list(found)[:1]
            trace_of[members] = np.arange(members.size)
        else:
            shares = pick(found, spec.traces, spec.file, f"conditions.{self.names[i]}.{kind}")
            order = list(shares)
            if members.size:
                chosen = _mix_labels(shares, members.size, self.seed, salt + 1)
                trace_of[members] = [order.index(t) for t in chosen]
        times = [found[t][0] for t in order]
        values = [found[t][1] for t in order]
        period = np.array([t[-1] - t[0] for t in times])
        if spec.offset_s == "random":
            offset = client_uniforms(np.arange(len(self.profiles)), self.seed, 0, salt + 2) * period[trace_of]
        else:
            offset = np.full(len(self.profiles), float(spec.offset_s))
        process = make(members, times, values, trace_of, offset)
        process.trace_names = order
        return process

    def _availability(self, spec, i: int):
        if isinstance(spec, Bernoulli):
            return None
        salt = SALTS["availability"] + 16 * i
        if isinstance(spec, DiurnalSpec):
            n = len(self.profiles)
            if isinstance(spec.tz_offset_h, Uniform):
                u = client_uniforms(np.arange(n), self.seed, 0, salt + 1)
                tz = spec.tz_offset_h.low + u * (spec.tz_offset_h.high - spec.tz_offset_h.low)
            else:
                tz = np.full(n, float(spec.tz_offset_h))
            return Diurnal(spec.hourly, tz, self.seed, salt)
        found = read_interval_traces(spec.file)
        return self._traces(found, spec, "availability", i, salt,
                            lambda ids, starts, ends, of, off: Intervals(starts, ends, of, off, spec.loop))

    def never_online(self, start_s: float) -> np.ndarray:
        """True for the clients whose availability process can never put them online from
        ``start_s`` on (a diurnal profile of zeros; replayed intervals that all end before)."""
        never = np.zeros(len(self.labels), dtype=bool)
        for i, process in self.availability.items():
            members = self._members(i)
            if isinstance(process, Diurnal):
                never[members] = not (process.hourly > 0).any()
            elif isinstance(process, Intervals) and not process.loop:
                last = np.array([e[-1] if len(e) else -np.inf for e in process.ends])
                never[members] = last[process.trace_of[members]] - process.offset[members] <= start_s
        return never

    # ------------------------------------------------------------------ a round
    def online(self, ids, start_s: float, round: int, bernoulli: np.ndarray):
        """(online at the round's start, the time each client leaves; inf: it stays) for the
        selected ``ids``: a set's availability process, else today's coin (``bernoulli``)."""
        ids = np.asarray(ids, dtype=np.int64)
        on = np.asarray(bernoulli, dtype=bool).copy()
        leaves = np.full(len(ids), np.inf)
        for i, process in self.availability.items():
            sel = np.flatnonzero(self.code[ids] == i)
            if process is None or not sel.size:
                continue
            on[sel], leaves[sel] = process.online(ids[sel], np.full(sel.size, start_s), round)
        return on, leaves

    def now(self, ids, t: float) -> dict[int, dict[str, float]]:
        """Per client of a set with link or compute processes: its profile's ``down_mbps``,
        ``up_mbps`` and ``gflops`` as they are at time ``t`` (what a method reading the client's
        profile sees in a round that starts at ``t``)."""
        ids = np.asarray(ids, dtype=np.int64)
        out: dict[int, dict[str, float]] = {}
        for i in np.flatnonzero(self.varies):
            c = ids[self.code[ids] == i]
            if not c.size:
                continue
            at = np.full(c.size, float(t))
            down = self.down[i].pieces(c, at, 1)[1][:, 0] / 1e6
            up = self.up[i].pieces(c, at, 1)[1][:, 0] / 1e6
            gflops = self.compute[i].pieces(c, at, 1)[1][:, 0] / 1e9
            for k, cid in enumerate(c.tolist()):
                out[cid] = {"down_mbps": float(down[k]), "up_mbps": float(up[k]), "gflops": float(gflops[k])}
        return out

    def timeline(self, ids, start_s: float, times: dict, bytes_down, bytes_up, train_flops, compress_ops,
                 measured_compute_s=None) -> dict:
        """Absolute phase ends of the runnable ``ids`` from the round's start ``start_s``;
        ``times`` (today's closed-form durations) is updated in place for clients whose sets
        have link or compute processes. Returns the extra columns (ends, achieved Mbps, states)."""
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        p = self.profiles
        out = {
            "download_end_s": start_s + times["download_s"],
            "train_end_s": None, "compress_end_s": None, "upload_end_s": None,
            "down_state": np.full(n, "", dtype=object), "up_state": np.full(n, "", dtype=object),
        }
        out["train_end_s"] = out["download_end_s"] + times["compute_s"]
        out["compress_end_s"] = out["train_end_s"] + times["compress_s"]
        out["upload_end_s"] = out["compress_end_s"] + times["upload_s"]
        bd, bu = np.broadcast_to(bytes_down, n), np.broadcast_to(bytes_up, n)
        fl, ops = np.broadcast_to(train_flops, n), np.broadcast_to(compress_ops, n)
        for i in np.flatnonzero(self.varies):
            sel = np.flatnonzero(self.code[ids] == i)
            if not sel.size:
                continue
            c = ids[sel]
            lat = p.latency_s[c]
            t_down = np.full(sel.size, start_s) + lat
            out["down_state"][sel] = self.down[i].state_at(c, t_down)
            dl_end = finish_times(self.down[i], c, t_down, 8.0 * bd[sel])
            if measured_compute_s is not None:
                tr_end = dl_end + np.asarray(measured_compute_s, dtype=np.float64)[sel]
            else:
                tr_end = finish_times(self.compute[i], c, dl_end, fl[sel])
            cp_end = finish_times(self.compute[i], c, tr_end, ops[sel] * OPS_TO_FLOPS)
            t_up = cp_end + lat
            out["up_state"][sel] = self.up[i].state_at(c, t_up)
            up_end = finish_times(self.up[i], c, t_up, 8.0 * bu[sel])
            for key, value in (("download_end_s", dl_end), ("train_end_s", tr_end),
                               ("compress_end_s", cp_end), ("upload_end_s", up_end)):
                out[key][sel] = value
            times["download_s"][sel] = dl_end - start_s
            times["compute_s"][sel] = tr_end - dl_end
            times["compress_s"][sel] = cp_end - tr_end
            times["upload_s"][sel] = up_end - cp_end
            times["total_s"][sel] = up_end - start_s
        with np.errstate(divide="ignore", invalid="ignore"):
            down_time = out["download_end_s"] - start_s - p.latency_s[ids]
            up_time = out["upload_end_s"] - out["compress_end_s"] - p.latency_s[ids]
            out["down_mbps"] = np.where(down_time > 0, 8.0 * bd / down_time / 1e6, np.nan)
            out["up_mbps"] = np.where(up_time > 0, 8.0 * bu / up_time / 1e6, np.nan)
        return out
