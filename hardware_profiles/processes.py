"""Processes over virtual time: piecewise-constant rates (links, compute speed) and availability.

DESIGN.md, "Time model, version 2". Every draw is counter-seeded per (seed, process salt,
client, slot), so what a client meets never depends on the executor, on which other clients
are asked with it, or on the order of the questions.

* :func:`finish_times` is the one integrator: where work that starts at ``t0`` ends, for an
  amount (bits through a link, FLOPs through a processor) and a piecewise-constant rate,
  exactly over the pieces, never sampled at ``t0``.
* Rates: :class:`ConstantRates` (today's), :class:`MarkovRates` (a chain over named states,
  one step per ``slot_s``; Gilbert-Elliott is the two-state case), :class:`TraceRates`
  (replayed pieces, looped or held past the end, shifted per client).
* Availability: :class:`Diurnal` (probability by the client's local hour at the round's
  start) and :class:`Intervals` (replayed online intervals: online at the round's start, and
  gone at the end of that interval).

Vectorised over clients throughout; the only Python loops run over pieces, slots or traces.
"""
from __future__ import annotations

import functools

import numpy as np

from .clock import _splitmix64, _u64

_WINDOW = 2  # pieces the integrator looks at per pass (most transfers end in the first); doubled after


def keyed_uniforms(ids, slots, seed: int, salt: int) -> np.ndarray:
    """U[0,1) per (client, slot), a pure function of (seed, salt, client id, slot)."""
    k0, k1 = _key(int(seed), int(salt))
    ids = _u64(np.asarray(ids, dtype=np.int64).reshape(-1))
    slots = _u64(np.asarray(slots, dtype=np.int64).reshape(-1))
    with np.errstate(over="ignore"):
        h = _splitmix64(_splitmix64(ids * _u64(0x9E3779B97F4A7C15) + k0) ^ (slots * _u64(0xD1B54A32D192ED03)))
        h = _splitmix64(h ^ k1)
    return (h >> _u64(11)).astype(np.float64) * (1.0 / (1 << 53))


@functools.lru_cache(maxsize=256)
def _key(seed: int, salt: int) -> tuple[np.uint64, np.uint64]:
    k0, k1 = np.random.SeedSequence([seed, salt]).generate_state(2, np.uint64)
    return k0, k1


# --------------------------------------------------------------------------- the integrator


def finish_times(rates, ids, start_s, amount) -> np.ndarray:
    """For each client ``ids[i]``: the time ``T`` at which the integral of its rate from
    ``start_s[i]`` reaches ``amount[i]`` (rates in units per second, > 0)."""
    ids = np.asarray(ids, dtype=np.int64)
    t = np.array(start_s, dtype=np.float64, copy=True).reshape(-1)
    left = np.array(amount, dtype=np.float64, copy=True).reshape(-1)
    out = t.copy()  # no work: it ends where it starts
    todo = np.flatnonzero(left > 0)
    window = _WINDOW
    while todo.size:
        edges, values = rates.pieces(ids[todo], t[todo], window)  # (n, W + 1), (n, W)
        with np.errstate(invalid="ignore"):  # inf - inf past a held last piece: never reached
            cum = np.cumsum(np.diff(edges, axis=1) * values, axis=1)
        need = left[todo]
        reached = cum >= need[:, None]
        finished = reached.any(axis=1)
        rows = np.flatnonzero(finished)
        k = np.argmax(reached[rows], axis=1)
        before = np.where(k > 0, cum[rows, np.maximum(k - 1, 0)], 0.0)
        out[todo[rows]] = edges[rows, k] + (need[rows] - before) / values[rows, k]
        rest = np.flatnonzero(~finished)
        left[todo[rest]] -= cum[rest, -1]
        t[todo[rest]] = edges[rest, -1]
        todo = todo[rest]
        window = min(2 * window, 4096)
    return out


# --------------------------------------------------------------------------- rate processes


class ConstantRates:
    """One rate per client, for all time."""

    def __init__(self, rate):
        self.rate = np.asarray(rate, dtype=np.float64)

    def pieces(self, ids, t0, window):
        edges = np.empty((len(ids), 2))
        edges[:, 0], edges[:, 1] = t0, np.inf
        return edges, self.rate[ids][:, None]

    def state_at(self, ids, t) -> np.ndarray:
        return np.full(len(ids), "", dtype=object)


class MarkovRates:
    """A Markov chain per client over named states, one step every ``slot_s`` seconds of
    virtual time from ``origin_s`` (the run's start), started from the ``start`` distribution;
    the rate in a state is its value times the client's ``scale`` (e.g. its profile's Mbps when
    values are factors).

    A client's chain is advanced on demand and only its current slot and state are kept: the
    engine asks each process of a client for later and later times, and a question about an
    earlier time replays that client's chain from slot 0 (the same states: they are a pure
    function of the seed, the client and the slot)."""

    def __init__(self, values, transition, start, slot_s: float, scale, seed: int, salt: int, names,
                 origin_s: float = 0.0):
        self.origin = float(origin_s)
        self.values = np.asarray(values, dtype=np.float64)
        self.cum = np.cumsum(np.asarray(transition, dtype=np.float64), axis=1)
        self.cum[:, -1] = np.inf  # a row that sums to 1 within rounding still covers every u < 1
        self.start_cum = np.cumsum(np.asarray(start, dtype=np.float64))
        self.start_cum[-1] = np.inf
        self.slot_s = float(slot_s)
        self.scale = np.asarray(scale, dtype=np.float64)
        self.seed, self.salt = int(seed), int(salt)
        self.names = np.asarray(names, dtype=object)
        self._slot = np.full(len(self.scale), -1, dtype=np.int64)  # per client: current slot
        self._state = np.zeros(len(self.scale), dtype=np.int64)  # ... and its state

    def _start(self, ids) -> None:
        u = keyed_uniforms(ids, np.zeros(len(ids), dtype=np.int64), self.seed, self.salt)
        self._state[ids] = (u[:, None] >= self.start_cum[None, :]).sum(axis=1)
        self._slot[ids] = 0

    def _step(self, ids) -> None:
        nxt = self._slot[ids] + 1
        u = keyed_uniforms(ids, nxt, self.seed, self.salt)
        self._state[ids] = (u[:, None] >= self.cum[self._state[ids]]).sum(axis=1)
        self._slot[ids] = nxt

    def _seek(self, ids, slot) -> None:
        """Clients ``ids`` to slot ``slot`` (per client)."""
        back = self._slot[ids] > slot
        self._slot[ids[back]] = -1
        fresh = ids[self._slot[ids] < 0]
        if fresh.size:
            self._start(fresh)
        behind = self._slot[ids] < slot
        while behind.any():
            self._step(ids[behind])
            behind = self._slot[ids] < slot

    def states(self, ids, k0, width: int) -> np.ndarray:
        """State numbers of slots ``k0 .. k0 + width - 1`` per client, (n, width)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), width), dtype=np.int64)
        self._seek(ids, np.asarray(k0, dtype=np.int64))
        out[:, 0] = self._state[ids]
        for j in range(1, width):
            self._step(ids)
            out[:, j] = self._state[ids]
        return out

    def pieces(self, ids, t0, window):
        t0 = np.asarray(t0, dtype=np.float64)
        k0 = np.maximum(np.floor((t0 - self.origin) / self.slot_s), 0).astype(np.int64)
        states = self.states(ids, k0, window)
        edges = self.origin + (k0[:, None] + np.arange(window + 1)[None, :]).astype(np.float64) * self.slot_s
        edges[:, 0] = t0
        return edges, self.values[states] * self.scale[ids][:, None]

    def state_at(self, ids, t) -> np.ndarray:
        k = np.maximum(np.floor((np.asarray(t, dtype=np.float64) - self.origin) / self.slot_s), 0)
        return self.names[self.states(ids, k.astype(np.int64), 1)[:, 0]]


class TraceRates:
    """Replayed piecewise-constant rates: client c is at time ``t + offset_s[c]`` of trace
    ``trace_of[c]``. A trace is rows ``(t_s, value)``; piece i spans ``[t_i, t_{i+1})`` and the
    last row's time is the trace's end. Past the end it loops (period: last time - first time)
    or holds the last row's value (``loop=False``). Times are taken from the first row."""

    def __init__(self, times, values, trace_of, offset_s, loop: bool, scale=None):
        self.loop = bool(loop)
        lap = [len(t) - 1 if self.loop else len(t) for t in times]  # pieces of one pass
        m = max(lap)
        self.edges = np.full((len(times), m + 1), np.inf)
        self.vals = np.ones((len(times), m))
        self.lap = np.asarray(lap, dtype=np.int64)
        for i, (t, v) in enumerate(zip(times, values)):
            t = np.asarray(t, dtype=np.float64) - float(t[0])
            self.edges[i, :len(t)] = t
            self.vals[i, :lap[i]] = np.asarray(v, dtype=np.float64)[:lap[i]]
        self.period = np.array([np.asarray(t, dtype=np.float64)[-1] - float(t[0]) for t in times])
        self.trace_of = np.asarray(trace_of, dtype=np.int64)
        self.offset = np.asarray(offset_s, dtype=np.float64)
        self.scale = np.ones(len(self.trace_of)) if scale is None else np.asarray(scale, dtype=np.float64)

    def _position(self, ids, t):
        """(trace, lap number, piece number within the lap) of each client at time ``t``."""
        tr = self.trace_of[ids]
        pos = np.asarray(t, dtype=np.float64) + self.offset[ids]
        laps = np.floor(pos / self.period[tr]) if self.loop else np.zeros(len(ids))
        local = pos - laps * self.period[tr]
        piece = np.empty(len(ids), dtype=np.int64)
        for trace in np.unique(tr):  # one search per trace, over its clients
            sel = tr == trace
            piece[sel] = np.searchsorted(self.edges[trace, :self.lap[trace]], local[sel], side="right") - 1
        return tr, laps, np.clip(piece, 0, None)

    def pieces(self, ids, t0, window):
        tr, laps, piece = self._position(ids, t0)
        steps = piece[:, None] + np.arange(window + 1)[None, :]
        lap = self.lap[tr][:, None]
        if self.loop:
            idx = steps % lap
            edges = self.edges[tr[:, None], idx] + (laps[:, None] + steps // lap) * self.period[tr][:, None]
        else:
            idx = np.minimum(steps, lap)
            edges = np.where(steps <= lap, self.edges[tr[:, None], idx], np.inf)
        values = self.vals[tr[:, None], np.minimum(idx[:, :-1], lap - 1)]
        edges = edges - self.offset[ids][:, None]
        edges[:, 0] = t0
        return edges, values * self.scale[ids][:, None]

    def state_at(self, ids, t) -> np.ndarray:
        """``<trace id>@<piece number>`` the client is on at ``t``."""
        tr, _, piece = self._position(ids, t)
        names = np.asarray(getattr(self, "trace_names", None) or [str(i) for i in range(len(self.period))])
        return np.char.add(np.char.add(names[tr], "@"), piece.astype(str)).astype(object)


# --------------------------------------------------------------------------- availability


class Diurnal:
    """Online with probability ``hourly[h]`` where ``h`` is the client's local hour at the
    round's start (``tz_offset_h`` per client); drawn per (seed, round, client)."""

    def __init__(self, hourly, tz_offset_h, seed: int, salt: int):
        self.hourly = np.asarray(hourly, dtype=np.float64)
        self.tz = np.asarray(tz_offset_h, dtype=np.float64)
        self.seed, self.salt = int(seed), int(salt)

    def local_hour(self, ids, t) -> np.ndarray:
        return np.floor(((np.asarray(t, dtype=np.float64) / 3600.0 + self.tz[ids]) % 24.0)).astype(np.int64) % 24

    def online(self, ids, t, round: int) -> tuple[np.ndarray, np.ndarray]:
        """(online at ``t``, time it leaves: inf, a diurnal client does not leave mid-round)."""
        u = keyed_uniforms(ids, np.full(len(ids), round, dtype=np.int64), self.seed, self.salt)
        return u < self.hourly[self.local_hour(ids, t)], np.full(len(ids), np.inf)


class Intervals:
    """Online during replayed intervals: client c follows interval set ``set_of[c]`` shifted by
    ``offset_s[c]``, looped with ``period_s`` (the set's last end) if ``loop``."""

    def __init__(self, starts, ends, set_of, offset_s, loop: bool):
        self.starts = [np.asarray(s, dtype=np.float64) for s in starts]
        self.ends = [np.asarray(e, dtype=np.float64) for e in ends]
        self.period = np.array([float(e[-1]) if len(e) else 0.0 for e in self.ends])
        self.trace_of = np.asarray(set_of, dtype=np.int64)
        self.offset = np.asarray(offset_s, dtype=np.float64)
        self.loop = bool(loop)

    def online(self, ids, t, round: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(online at ``t``, the time its interval ends: it leaves then)."""
        ids = np.asarray(ids, dtype=np.int64)
        sets = self.trace_of[ids]
        pos = np.asarray(t, dtype=np.float64) + self.offset[ids]
        on = np.zeros(len(ids), dtype=bool)
        leaves = np.full(len(ids), np.inf)
        for s in np.unique(sets):  # one search per interval set, over its clients
            sel = np.flatnonzero(sets == s)
            if not len(self.starts[s]):
                continue
            p = pos[sel]
            lap = np.floor(p / self.period[s]) if self.loop and self.period[s] > 0 else np.zeros(len(sel))
            local = p - lap * self.period[s]
            i = np.searchsorted(self.starts[s], local, side="right") - 1
            inside = (i >= 0) & (local < self.ends[s][np.clip(i, 0, None)])
            on[sel] = inside
            end = self.ends[s][np.clip(i, 0, None)] + lap * self.period[s] - self.offset[ids[sel]]
            leaves[sel] = np.where(inside, end, np.inf)
        return on, leaves
