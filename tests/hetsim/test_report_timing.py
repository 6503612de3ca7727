"""The what-if page of a ``clock.mode: timing_only`` run (hetsim/report_timing.py) and
``hetsim whatif --timing-only``."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import yaml
from helpers.reports import BROWSERS, assert_figures, parse_page, screenshot

from engine.config.schema import load_config
from engine.results.tables import load_run
from engine.run.api import run_experiment
from hetsim.cli import main
from hetsim.report import RUN_FIGURES, TIMING_FIGURES, build_report

FLEET = ("clients.profiles={devices: {phone_low: 0.3, laptop_cpu: 0.7}, network: {5mbps: 0.4, wifi: 0.6}, "
         "battery: {start: {low: 0.2, high: 0.9}}}")
TIMING = ["dataset.name=synthetic", "dataset.params={lazy: true}", "partition.scheme=natural", "model.name=mlp",
          "clients.num_clients=3000", "clients.participation=0.02", "rounds=8", "clock.mode=timing_only",
          "clock.deadline={policy: percentile, percent: 75}", "clock.over_selection=1.2", FLEET]


@pytest.fixture(scope="module")
def timing_run(tmp_path_factory):
    return run_experiment(load_config(None, TIMING), tmp_path_factory.mktemp("t") / "run", command=[])


def test_the_what_if_page_has_the_fleet_sections_and_no_accuracy(timing_run, tmp_path):
    out = build_report(timing_run, tmp_path / "report.html")
    page = parse_page(out)
    shown = [f for f in RUN_FIGURES if not f.startswith(("fig-accuracy", "table-fairness"))]
    assert_figures(page, out, [*TIMING_FIGURES, *shown, "fig-energy-battery"])
    assert not [f for f in page.figures if "accuracy" in f] and not page.omitted, page.omitted
    text = out.read_text()
    assert "<h1>hetsim what-if (timing only): run</h1>" in text
    assert "personalized accuracy" not in text and "training</td>" in text
    rounds = load_run(timing_run).rounds
    # the summary's numbers are the tables': the deadline the percentile policy set, the arrivals
    median = float(np.median(rounds["sim_deadline_s"]))
    assert f"{median:.3g} s" in text
    assert f"{rounds['num_arrived'].mean():.1f} of {rounds['num_selected'].mean():.1f} selected" in text


@pytest.mark.skipif(not any(map(shutil.which, BROWSERS)), reason="no headless Chromium installed "
                    "(Debian: apt-get install chromium)")
def test_the_what_if_figures_render_in_a_headless_browser(timing_run, tmp_path):
    from PIL import Image

    out = build_report(timing_run, tmp_path / "rep.html")
    shutil.rmtree(tmp_path / "rep_figures")  # the page alone
    text = out.read_text()

    def coloured_share(html: str, name: str) -> float:
        path = tmp_path / f"{name}.html"
        path.write_text(html)
        screenshot(path, tmp_path / f"{name}.png")
        img = np.asarray(Image.open(tmp_path / f"{name}.png").convert("RGB")).astype(int)
        return float(((img.max(axis=2) - img.min(axis=2)) > 60).mean())

    blank = re.sub(r'(<figure id="[^"]+"><img alt="[^"]*" )src="data:[^"]*"', r'\1src=""', text)
    drawn, without = coloured_share(text, "page"), coloured_share(blank, "blank")
    assert drawn > without + 0.01, (drawn, without)


@pytest.mark.ray
def test_whatif_timing_only_times_each_fleet_and_compares_their_arrivals(tmp_path, ray_session, capsys):
    spec = tmp_path / "whatif.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "links", "timing_only": True, "storage": str(tmp_path / "wi"), "max_concurrent_trials": 1,
        "base": {"rounds": 4, "dataset": {"name": "synthetic", "params": {"lazy": True}},
                 "partition": {"scheme": "natural"}, "model": {"name": "mlp"},
                 "clients": {"num_clients": 2000, "participation": 0.02}, "clock": {"deadline_s": 0.05}},
        "fleets": [{"name": "fast", "profiles": {"network": {"500mbps": 1.0}}},
                   {"name": "slow", "profiles": {"network": {"5mbps": 0.5, "500mbps": 0.5}}}]}))
    assert main(["whatif", str(spec), "-q"]) == 0
    out = capsys.readouterr().out
    assert "slow vs fast: no accuracy (timing only), different arrivals from round 0" in out
    assert "final_num_arrived" in out and "global_acc" not in out
    slow = load_run(tmp_path / "wi" / "fleets" / "slow")
    assert slow.config["clock"]["mode"] == "timing_only" and "global_acc" not in slow.rounds
    assert (slow.clients["drop_reason"] == "deadline").any()  # the 5 Mbps half misses 50 ms
    assert 'id="fig-whatif-heard"' in build_report(tmp_path / "wi" / "fleets" / "slow").read_text()
