"""The run report's "Conditions over virtual time" section: drawn for a fleet with conditions,
absent (the report unchanged) without; the drop times and the virtual-time labels it shows."""
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import one_torch_thread
from helpers.reports import BROWSERS, assert_figures, parse_page, screenshot

from engine.config.schema import load_config
from engine.results.tables import load_run
from engine.run.api import run_experiment
from hetsim.plots import time_labels, virtual_time
from hetsim.report import CONDITIONS_FIGURES, RUN_FIGURES, build_report
from hetsim.report_conditions import (
    MAX_LINK_CLIENTS,
    client_sets,
    drop_events,
    has_conditions,
    link_sample,
    round_times,
)

# as tests/hardware_profiles/test_conditions.py's TINY: digits + mlp, 10 clients, 4 rounds
TINY = ["dataset.name=digits", "model.name=mlp", "clients.num_clients=10", "clients.participation=0.6",
        "rounds=4", "clients.profiles={network: {5mbps: 0.5, 50mbps: 0.5}}", "clock.start=Tue 21:30"]


def run(path, *extra):
    with one_torch_thread():
        return run_experiment(load_config(None, [*TINY, *extra]), path)


@pytest.fixture(scope="module")
def cond_run(tmp_path_factory):
    """Fading links and compute, clients online in 30 ms blinks (some leave mid-round: offline),
    night phones, and a deadline: every kind of loss the section draws but nonfinite."""
    base = tmp_path_factory.mktemp("cond")
    blink = base / "blink.csv"
    pd.DataFrame({"trace_id": ["blink"] * 2, "start_s": [0.0, 0.05], "end_s": [0.03, 0.1]}).to_csv(blink, index=False)
    sets = ("{fading: {share: 0.4, down: gilbert_elliott, up: {preset: gilbert_elliott, slot_s: 0.5}, "
            "compute: thermal_throttling}, "
            f"blinking: {{share: 0.3, availability: {{kind: intervals, file: '{blink}', offset_s: random}}}}, "
            "night: {share: 0.3, availability: {preset: night_charging, tz_offset_h: {low: -3, high: 3}}}}")
    return run(base / "run", f"clients.profiles.conditions={{sets: {sets}}}", "clock.deadline_s=0.05",
               "clock.over_selection=1.3")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("plain") / "run", "clock.deadline_s=0.05")


def test_a_run_with_conditions_gets_the_section(cond_run, tmp_path):
    r = load_run(cond_run)
    assert has_conditions(r)
    assert {"", "offline", "deadline", "unavailable"} <= set(r.clients["drop_reason"])
    out = build_report(cond_run, tmp_path / "rep.html")
    page = parse_page(out)
    assert_figures(page, out, RUN_FIGURES + CONDITIONS_FIGURES)  # in the HTML, the PNGs beside it
    assert not page.omitted
    text = out.read_text()
    assert "<h2>Conditions over virtual time</h2>" in text
    # after the run's own figures, in the order of CONDITIONS_FIGURES
    where = [text.index(f'id="{fig_id}"') for fig_id in RUN_FIGURES + CONDITIONS_FIGURES]
    assert where == sorted(where)


def test_a_run_without_conditions_gets_the_report_it_always_got(plain_run, tmp_path):
    assert not has_conditions(load_run(plain_run))
    out = build_report(plain_run, tmp_path / "plain.html")
    page = parse_page(out)
    energy = ("fig-energy-accuracy", "fig-energy-tiers")  # every run has a ledger; no batteries here
    assert set(page.figures) == {*RUN_FIGURES, *energy} and not page.omitted
    assert "Conditions over virtual time" not in out.read_text()
    assert sorted(p.stem for p in (tmp_path / "plain_figures").glob("*.png")) == sorted([*RUN_FIGURES, *energy])


def test_drops_are_placed_when_the_server_lost_the_client(cond_run):
    r = load_run(cond_run)
    times = round_times(r)
    assert np.allclose(times["start_s"], r.rounds["round_start_s"])
    ev = drop_events(r).merge(r.clients[["round", "client_id", "upload_end_s"]], on=["round", "client_id"])
    start, end = ev["round"].map(times["start_s"]), ev["round"].map(times["end_s"])
    never_ran = ev["reason"].isin(["unavailable", "dropout"])
    assert (ev.loc[never_ran, "t"] == start[never_ran]).all()
    late = ev["reason"] == "deadline"
    # too slow: lost when the round closed, at the deadline or earlier (its target met without it)
    assert late.any() and (ev.loc[late, "t"] == end[late]).all() and (end[late] <= start[late] + 0.05 + 1e-9).all()
    gone = ev["reason"] == "offline"
    assert gone.any() and (ev.loc[gone, "t"] <= ev.loc[gone, "upload_end_s"]).all()
    assert ((ev["t"] >= start) & (ev["t"] <= end + 1e-9)).all()
    assert len(ev) == (r.clients["drop_reason"] != "").sum()


def test_the_link_sample_is_deterministic_and_spread_over_the_sets(cond_run):
    r = load_run(cond_run)
    sets, order = client_sets(r)
    assert order == ["fading", "blinking", "night"]  # the config's order
    clients = r.clients.assign(set=r.clients["client_id"].map(sets))
    sample = link_sample(clients, ["down_mbps", "up_mbps"], order)
    assert sample == link_sample(clients.sample(frac=1.0, random_state=1), ["down_mbps", "up_mbps"], order)
    assert len(sample) == len(set(sample)) <= MAX_LINK_CLIENTS
    ran = clients[clients["down_mbps"] > 0]
    assert {sets[c] for c in sample} == set(ran["set"])  # every set that ran is in it
    assert link_sample(clients, ["down_mbps", "up_mbps"], order, k=2) == sample[:2]


def test_virtual_time_is_day_and_time_of_the_week():
    assert virtual_time(0) == "Mon 00:00"
    assert virtual_time(86400 + 21 * 3600) == "Tue 21:00"
    assert virtual_time(86400 + 21 * 3600 + 29.6) == "Tue 21:00"  # minutes: rounded
    assert virtual_time(86400 + 21 * 3600 + 5, digits=1) == "Tue 21:00:05"
    assert virtual_time(6 * 86400 + 23 * 3600 + 59 * 60 + 59.94, digits=2) == "Sun 23:59:59.9"
    assert virtual_time(86400 + 0.046, digits=3) == "Tue 00:00:00.05"
    assert virtual_time(7 * 86400 + 8 * 3600) == "w2 Mon 08:00"
    # the day where it changes only
    t = 86400 + np.array([22, 23, 24, 25]) * 3600.0
    assert time_labels(t, 0) == ["Tue 22:00", "23:00", "Wed 00:00", "01:00"]


@pytest.mark.skipif(not any(map(shutil.which, BROWSERS)), reason="no headless Chromium installed "
                    "(Debian: apt-get install chromium)")
def test_the_section_renders_in_a_headless_browser(cond_run, tmp_path):
    """Chromium draws the conditions figures from the page alone (no figures folder)."""
    from PIL import Image

    page = build_report(cond_run, tmp_path / "rep.html")
    shutil.rmtree(tmp_path / "rep_figures")
    text = page.read_text()

    def only(ids) -> str:  # the page with every other figure's image blanked
        return re.sub(r'(<figure id="([^"]+)"><img alt="[^"]*" )src="data:[^"]*"',
                      lambda m: m.group(0) if m.group(2) in ids else f'{m.group(1)}src=""', text)

    def coloured_share(html: str, name: str) -> float:
        path = tmp_path / f"{name}.html"
        path.write_text(html)
        screenshot(path, tmp_path / f"{name}.png")
        img = np.asarray(Image.open(tmp_path / f"{name}.png").convert("RGB")).astype(int)
        return float(((img.max(axis=2) - img.min(axis=2)) > 60).mean())

    with_section, without = coloured_share(only(CONDITIONS_FIGURES), "section"), coloured_share(only(()), "blank")
    # the blank page keeps what is not a figure (e.g. a warning banner): the figures add to it
    assert with_section > 0.01 and with_section > without + 0.01, (with_section, without)
