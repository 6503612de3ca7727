"""Report nits: a download line identical to the upload line stays visible and is
named; tier counts that differ between panels say what they count; legends sit outside the
axes, never over a curve's end; accuracy axes span at least 10 points; the compare page has one
name. Figures are inspected as matplotlib objects (no PNG), on one small real run."""
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from engine.config.schema import load_config
from engine.results import load_run
from engine.run.api import run_experiment
from hetsim import plots
from hetsim.cli import main
from hetsim.compare import Entry, compare_page
from hetsim.page import Page
from hetsim.report import accuracy_figures, bytes_figure, time_figures
from hetsim.report_participation import participation_summary


class Figures(Page):
    """A page that keeps the matplotlib figures and captions instead of their PNGs."""

    def __init__(self):
        super().__init__("test")
        self.figs, self.captions = {}, {}

    def figure(self, fig_id, fig, caption=""):
        self.figs[fig_id], self.captions[fig_id] = fig, caption


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("nits") / "run"
    run_experiment(load_config(None, [
        "dataset.name=digits", "model.name=mlp", "clients.num_clients=10", "rounds=4", "seed=3",
        "clients.participation=0.5",
        "clients.profiles={devices: {rpi4: 0.5, laptop_cpu: 0.5}, network: {5mbps: 0.5, 50mbps: 0.5}, "
        "availability: 0.6}"]), path)
    return load_run(path)


def _copy(run, **rounds_columns):
    r = run.rounds.copy()
    for col, values in rounds_columns.items():
        r[col] = values
    return SimpleNamespace(rounds=r, clients=run.clients, profiles=run.profiles, config=run.config,
                           manifest=run.manifest, path=run.path)


def _lines(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_an_upload_equal_to_the_download_is_drawn_under_it_and_named(run):
    assert np.array_equal(run.rounds["bytes_up"], run.rounds["bytes_down"])  # FedAvg: the broadcast comes back
    page = Figures()
    bytes_figure(page, run)
    lines = _lines(page.figs["fig-bytes-time"].axes[0])
    assert set(lines) == {"download (= upload)", "upload"}
    down, up = lines["download (= upload)"], lines["upload"]
    assert down.get_linestyle() == "--" and down.get_linewidth() > 2 * up.get_linewidth()
    assert np.array_equal(down.get_ydata(), up.get_ydata())
    assert "dashed download lies under the upload" in page.captions["fig-bytes-time"]
    assert page.figs["fig-bytes"].axes[1].get_title(loc="left").endswith("(= download)")
    # different series: two plain lines, no note
    page = Figures()
    bytes_figure(page, _copy(run, bytes_up=run.rounds["bytes_up"] // 3))
    lines = _lines(page.figs["fig-bytes-time"].axes[0])
    assert set(lines) == {"download", "upload"} and lines["download"].get_linestyle() == "-"
    assert "equal" not in page.captions["fig-bytes-time"]


def test_tier_counts_say_what_they_count_and_agree_with_the_participation_panel(run):
    page = Figures()
    time_figures(page, run)
    shares = participation_summary(run).shares["device tier"]
    titles = [ax.get_title(loc="left") for ax in page.figs["fig-time-device-tier"].axes if ax.get_title(loc="left")]
    assert len(titles) == 2
    partial = 0
    for title in titles:
        m = re.fullmatch(r"(\S+)  \((\d+)(?: of (\d+) selected)? clients ran\)", title)
        assert m, title
        tier, ran, selected = m.group(1), int(m.group(2)), int(m.group(3) or m.group(2))
        assert selected == shares.loc[tier, "clients"]  # the participation panel's "(n selected)"
        ran_ids = run.clients[(run.clients["tier"] == tier) & run.clients["sim_total_s"].notna()]["client_id"]
        assert ran == ran_ids.nunique()
        partial += ran < selected
    assert partial >= 1  # availability 0.6: some selected client never ran
    assert "ever selected" in page.captions["fig-time-device-tier"]


def test_legends_are_outside_the_axes(run):
    page = Figures()
    accuracy_figures(page, run)
    bytes_figure(page, run)
    for fig_id in ("fig-accuracy-round", "fig-accuracy-time", "fig-bytes-time"):
        fig = page.figs[fig_id]
        fig.draw_without_rendering()
        ax = fig.axes[0]
        (legend,) = [lg for lg in [ax.get_legend(), *fig.legends] if lg is not None]
        assert not legend.get_window_extent().overlaps(ax.get_window_extent()), fig_id


def test_min_span_widens_a_narrow_accuracy_axis_within_0_1():
    fig, (ax,) = plots.figure()
    ax.plot([0, 1, 2], [0.851, 0.855, 0.858])
    plots.min_span(ax)
    lo, hi = ax.get_ylim()
    assert hi - lo == pytest.approx(0.10) and lo < 0.851 and hi > 0.858
    ax.set_ylim(0.96, 0.99)
    plots.min_span(ax)
    assert ax.get_ylim() == pytest.approx((0.90, 1.0))  # kept within [0, 1]
    ax.set_ylim(0.2, 0.7)
    plots.min_span(ax)
    assert ax.get_ylim() == pytest.approx((0.2, 0.7))  # wide enough: unchanged


def test_the_compare_page_keeps_0_7_points_small_and_names_server_steps(run, monkeypatch):
    n = len(run.rounds)
    a = _copy(run, global_acc=np.linspace(0.851, 0.858, n))
    b = _copy(run, global_acc=np.linspace(0.850, 0.851, n))
    b.config = {**run.config, "asynchronous": {"mode": "fedbuff"}}
    captured = Figures()
    monkeypatch.setattr(Page, "figure", lambda self, fig_id, fig, caption="": captured.figure(fig_id, fig, caption))
    compare_page([Entry("a", a), Entry("b", b)], "global_acc", 0.85)
    for fig_id in ("fig-compare-accuracy-round", "fig-compare-accuracy-time"):
        lo, hi = captured.figs[fig_id].axes[0].get_ylim()
        assert hi - lo == pytest.approx(0.10), fig_id  # 0.8 points apart: a tenth of the axis, not all of it
    assert captured.figs["fig-compare-accuracy-round"].axes[0].get_xlabel() == "round (asynchronous: server step)"
    assert captured.figs["fig-compare-round-time"].axes[0].get_title(loc="left") == \
        "Simulated time per round or server step"


def test_compare_names_its_page_the_compare_page(run, tmp_path, capsys):
    assert main(["compare", str(run.path), str(run.path), "-o", str(tmp_path / "compare.html")]) == 0
    assert f"compare page: {tmp_path / 'compare.html'}" in capsys.readouterr().out


def test_an_asynchronous_run_report_counts_server_steps(run):
    steps = _copy(run)
    steps.config = {**run.config, "asynchronous": {"mode": "fedbuff"}}
    for source, word in ((run, "round"), (steps, "server step")):
        page = Figures()
        accuracy_figures(page, source)
        time_figures(page, source)
        ax = page.figs["fig-accuracy-round"].axes[0]
        assert ax.get_xlabel() == word and ax.get_title(loc="left") == f"Accuracy per {word}"
        fig = page.figs["fig-time-device-tier"]
        assert fig.get_suptitle().startswith(f"Simulated time per {word} by device tier")
        assert fig.axes[0].get_xlabel() == word


def test_the_ascend_legend_names_only_arms_the_run_has():
    from hetsim.report_methods import _arms

    nan = float("nan")
    clients = pd.DataFrame({"arm": ["topk", "randomk", None], "q_topk": [0.1, 0.2, nan],
                            "q_randomk": [0.3, nan, nan], "q_qsgd8": [nan, nan, nan]})
    run = SimpleNamespace(clients=clients, config={"algorithm": {"name": "ascend"}})
    assert _arms(run) == ["randomk", "topk"]  # an all-empty q_qsgd8 column is not an arm
    run.config["algorithm"]["arms"] = ["topk", "randomk", "periodick"]
    assert _arms(run) == ["topk", "randomk", "periodick"]
