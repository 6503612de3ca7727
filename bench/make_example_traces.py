"""Write hetsim's small example trace files (synthetic, seeded, numpy only).

    .venv/bin/python bench/make_example_traces.py            # rewrites hardware_profiles/traces/*.csv
    .venv/bin/python bench/make_example_traces.py --out DIR  # writes them into DIR instead

Every number in these files is SYNTHETIC: drawn with the fixed seed below from the simple models
described here, not measured anywhere. They exist to show the trace schema
(hardware_profiles/traces.py) and to give examples and tests something to replay; use real traces
(hardware_profiles/trace_formats.py converts FedScale, Mahimahi and HSDPA-format files) for
results about real networks. tests/hardware_profiles/test_trace_formats.py checks that the shipped files are exactly
what this script writes.

* ``fluctuating_links.csv`` -- 3 link traces (``trace_id, t_s, down_mbps, up_mbps``), one hour in
  60 s pieces. The downlink follows a mean-reverting random walk in log-rate,
  ``x[k+1] = x[k] + theta * (log(typical) - x[k]) + sigma * N(0, 1)``, the rate ``exp(x)``
  clipped to the link's range; the uplink is a fixed share of it. ``commuter_cellular`` (2-40
  Mbps, typical 10, theta 0.3, sigma 0.55, up 30 %): with probability 0.08 a piece is a handover
  or a tunnel, 1-2x the range's floor. ``home_wifi_evening`` (30-120 Mbps, typical 85, theta 0.2,
  sigma 0.2, up 20 %): an evening hour in a busy household, a dip (x 0.4, 3-8 pieces) starts with
  probability 0.05 per piece. ``rural_dsl`` (3-12 Mbps, typical 7, theta 0.25, sigma 0.2, up 15 %).
* ``night_phones.csv`` -- availability (``trace_id, start_s, end_s``) of 3 phones over one week
  (604800 s from Monday 00:00): online on the charger each night from a bedtime to a wake time
  (normal around the phone's habit -- ``phone_early`` 21:45-06:15, ``phone_typical`` 22:30-07:00,
  ``phone_late`` 23:00-07:45 -- sd 30 min, bedtimes clipped to 20:00-23:59, wake times to
  05:00-09:00), a night skipped with probability 0.1 (never the last, which runs to the week's
  end, so a looped replay has a one-week period), plus Poisson(1.2) daytime sessions a day of
  5-40 min starting between 08:00 and 21:00; times in whole seconds, overlaps merged.
* ``compute_throttle.csv`` -- 2 compute traces (``trace_id, t_s, factor``, factors in
  [0.4, 1.0]), one hour in 30 s pieces. ``thermal_phone``: a first-order thermal model under
  sustained load, ``T += dt * (25/300 * factor - (T - 25) / 300) + N(0, 0.5)`` degrees C, and a
  governor ``factor = clip(1 - 0.06 * (T - 38), 0.4, 1)``: full speed while cool, settling near
  0.7. ``battery_saver_tablet``: full speed (0.9-1.0) while its battery (38 % at the start,
  draining 0.25 +- 0.05 points per piece) is above 20 %, then battery saver (0.4-0.5).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "hardware_profiles" / "traces"
SEED = 20240607
WEEK_S = 7 * 86400
FILES = ("fluctuating_links.csv", "night_phones.csv", "compute_throttle.csv")

# name: (low Mbps, high Mbps, typical Mbps, theta, sigma, uplink share)
LINKS = {
    "commuter_cellular": (2.0, 40.0, 10.0, 0.3, 0.55, 0.30),
    "home_wifi_evening": (30.0, 120.0, 85.0, 0.2, 0.2, 0.20),
    "rural_dsl": (3.0, 12.0, 7.0, 0.25, 0.2, 0.15),
}
# name: (bedtime h, wake time h)
PHONES = {"phone_early": (21.75, 6.25), "phone_typical": (22.5, 7.0), "phone_late": (23.0, 7.75)}


def _rng(stream: int) -> np.random.Generator:
    return np.random.default_rng([SEED, stream])


def _num(x: float) -> str:
    """Rates and factors with 3 decimals; times as written (whole seconds print without a dot)."""
    return f"{x:.3f}"


def link_rows(rng: np.random.Generator) -> list[tuple]:
    piece_s, pieces = 60, 60
    rows = []
    for name, (low, high, typical, theta, sigma, up_share) in LINKS.items():
        mid = np.log(typical)
        x = mid + sigma * rng.standard_normal()
        down = np.empty(pieces)
        dip_left = 0
        for k in range(pieces):
            rate = float(np.clip(np.exp(x), low, high))
            if name == "commuter_cellular" and rng.random() < 0.08:
                rate = low * (1 + rng.random())  # a handover or a tunnel
            if name == "home_wifi_evening":
                if dip_left == 0 and rng.random() < 0.05:
                    dip_left = int(rng.integers(3, 9))
                if dip_left:
                    rate, dip_left = max(rate * 0.4, low), dip_left - 1
            down[k] = round(rate, 3)
            x = x + theta * (mid - x) + sigma * rng.standard_normal()
        up = np.round(down * up_share, 3)
        for k in range(pieces + 1):  # the last row marks the end and repeats the last piece
            j = min(k, pieces - 1)
            rows.append((name, k * piece_s, _num(down[j]), _num(up[j])))
    return rows


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def _wake(rng: np.random.Generator, wake_h: float, day: int) -> int:
    h = float(np.clip(wake_h + 0.5 * rng.standard_normal(), 5.0, 9.0))
    return int(round(day * 86400 + h * 3600))


def night_rows(rng: np.random.Generator) -> list[tuple]:
    rows = []
    for name, (bed_h, wake_h) in PHONES.items():
        sessions = [(0, _wake(rng, wake_h, 0))]  # Sunday night's charge runs into Monday morning
        for day in range(7):
            last = day == 6
            bed = float(np.clip(bed_h + 0.5 * rng.standard_normal(), 20.0, 23.99))
            end = WEEK_S if last else _wake(rng, wake_h, day + 1)
            if last or rng.random() >= 0.1:
                sessions.append((int(round(day * 86400 + bed * 3600)), end))
            for _ in range(int(rng.poisson(1.2))):
                start = day * 86400 + int(rng.integers(8 * 3600, 21 * 3600))
                sessions.append((start, start + int(rng.integers(300, 2401))))
        rows += [(name, s, e) for s, e in _merge(sessions)]
    return rows


def compute_rows(rng: np.random.Generator) -> list[tuple]:
    dt, pieces = 30, 120
    rows = []
    temp, factors = 25.0, []
    for _ in range(pieces):
        factor = float(np.clip(1 - 0.06 * (temp - 38.0), 0.4, 1.0))
        factors.append(round(factor, 3))
        temp += dt * (25.0 / 300 * factor - (temp - 25.0) / 300) + 0.5 * rng.standard_normal()
    battery, saver = 38.0, []
    for _ in range(pieces):
        if battery > 20.0:
            saver.append(round(float(np.clip(1 - abs(0.03 * rng.standard_normal()), 0.9, 1.0)), 3))
        else:
            saver.append(round(float(np.clip(0.45 + 0.02 * rng.standard_normal(), 0.4, 0.5)), 3))
        battery -= 0.25 + 0.05 * (2 * rng.random() - 1)
    for name, values in (("thermal_phone", factors), ("battery_saver_tablet", saver)):
        rows += [(name, k * dt, _num(values[min(k, pieces - 1)])) for k in range(pieces + 1)]
    return rows


def _write(path: Path, header: str, rows: list[tuple]) -> Path:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        f.write(header + "\n")
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    """Write the three files into ``--out`` (default hardware_profiles/traces/); returns their paths."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write into (default: %(default)s)")
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    written = [
        _write(out / FILES[0], "trace_id,t_s,down_mbps,up_mbps", link_rows(_rng(1))),
        _write(out / FILES[1], "trace_id,start_s,end_s", night_rows(_rng(2))),
        _write(out / FILES[2], "trace_id,t_s,factor", compute_rows(_rng(3))),
    ]
    for path in written:
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return written


if __name__ == "__main__":
    main()
