"""The energy ledger and batteries: every energy column recomputed from profiles.parquet and
the phase times with the formulas of docs/energy.md, battery levels replayed from the rows,
the participation threshold, a battery running empty mid-round, resume, and bad input."""
import numpy as np
import pandas as pd
import pytest

from engine.config.schema import load_config
from engine.errors import ConfigError
from engine.results.tables import load_run
from engine.run.api import resume_run, run_experiment
from hardware_profiles.catalog import load_catalog
from hardware_profiles.clock import client_times
from hardware_profiles.energy import BatterySpec, empties_at, ledger
from hardware_profiles.sampler import assign_profiles

BASE = [
    "dataset.name=digits", "model.name=mlp", "clients.num_clients=12", "clients.participation=0.5",
    "rounds=6", "evaluation.eval_every=3",
]
FLEET = ("clients.profiles={devices: {phone_low: 0.5, laptop_cpu: 0.25, rpi4: 0.25}, "
         "network: {4g: 0.5, wifi: 0.25, 5mbps: 0.25}, %s}")
# links that fade (time-varying phase times) and a deadline that cuts the slowest
CONDITIONS = "conditions: {sets: {fading: {down: gilbert_elliott, up: gilbert_elliott}}}"


def _run(tmp_path, name, *extra, fleet=CONDITIONS, **kw):
    cfg = load_config(None, [*BASE, FLEET % fleet, *extra])
    return load_run(run_experiment(cfg, tmp_path / name, **kw))


def recompute(clients: pd.DataFrame, profiles: pd.DataFrame) -> pd.DataFrame:
    """The documented formulas, in float64 pandas, from the tables alone."""
    ran = clients[clients["sim_total_s"].notna()].merge(
        profiles.drop(columns=["tier", "net_tier"]), on="client_id", suffixes=("", "_profile"))
    stop = (ran["left_s"] - ran["start_s"]).fillna(np.inf) if "left_s" in ran else np.inf
    down_end = ran["sim_download_s"]
    train_end = down_end + ran["sim_compute_s"]
    comp_end = train_end + ran["sim_compress_s"]
    up_end = comp_end + ran["sim_upload_s"]

    def part(begin, end):
        return np.clip(np.minimum(end, stop) - begin, 0, None)

    out = pd.DataFrame({"round": ran["round"], "client_id": ran["client_id"]})
    left = ran["left_s"].fillna(np.inf) if "left_s" in ran else np.inf  # tails: on the absolute columns
    out["energy_download_j"] = ((ran["idle_w"] + ran["rx_w"]) * part(0, down_end)
                                + np.where(ran["download_end_s"] < left, ran["tail_j"], 0.0))
    out["energy_train_j"] = ran["train_w"] * part(down_end, train_end)
    out["energy_compress_j"] = ran["train_w"] * part(train_end, comp_end)
    out["energy_upload_j"] = ((ran["idle_w"] + ran["tx_w"]) * part(comp_end, up_end)
                              + np.where(ran["upload_end_s"] < left, ran["tail_j"], 0.0))
    out["energy_j"] = out[["energy_download_j", "energy_train_j", "energy_compress_j", "energy_upload_j"]].sum(axis=1)
    return out


COLUMNS = ["energy_download_j", "energy_train_j", "energy_compress_j", "energy_upload_j", "energy_j"]


def test_every_energy_column_recomputed_from_profiles_and_phase_times(tmp_path):
    run = _run(tmp_path, "r", "clock.deadline_s=0.119")
    c = run.clients
    assert set(c["drop_reason"]) >= {"", "deadline"}  # late clients pay for their work too
    mine = recompute(c, run.profiles)
    got = c[c["sim_total_s"].notna()][["round", "client_id", *COLUMNS]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, mine.reset_index(drop=True), rtol=1e-12, check_dtype=False)
    assert (c.loc[c["sim_total_s"].isna(), "energy_j"].isna()).all()  # did not run: no energy
    # the 4g tails (12 J each) dominate a small MLP's round
    assert c.loc[c["net_tier"] == "4g", "energy_j"].min() > 24.0
    # fleet totals per round, and the share spent by clients whose update was not aggregated
    per_round = c.groupby("round")[COLUMNS].sum()
    for name in COLUMNS:
        np.testing.assert_allclose(run.rounds.set_index("round")[name], per_round[name], rtol=1e-12)
    wasted = c[~c["made_deadline"].astype(bool)].groupby("round")["energy_j"].sum()
    np.testing.assert_allclose(run.rounds.set_index("round")["energy_wasted_j"],
                               wasted.reindex(run.rounds["round"]).fillna(0.0), rtol=1e-12)
    assert run.rounds["energy_wasted_j"].sum() > 0


def test_the_ledger_truncates_a_client_that_stops_mid_round():
    profiles = assign_profiles({"devices": {"phone_mid": 1.0}, "network": {"4g": 1.0}}, 2, 0)
    times = client_times(profiles, [0, 1], 1e6, 1e6, 1e9)
    full = ledger(profiles, [0, 1], times)
    # download 0.04 + 0.4 s, train 0.125 s, upload 0.04 + 1.6 s (4g: 20 / 5 Mbps)
    np.testing.assert_allclose(full["energy_download_j"], (0.3 + 1.3) * 0.44 + 12.0)
    np.testing.assert_allclose(full["energy_train_j"], 3.5 * 0.125)
    np.testing.assert_allclose(full["energy_upload_j"], (0.3 + 2.0) * 1.64 + 12.0)
    cut = ledger(profiles, [0, 1], times, stop_s=[0.5, np.inf])  # client 0 stops in training
    np.testing.assert_allclose(cut["energy_train_j"][0], 3.5 * (0.5 - 0.44))
    assert cut["energy_upload_j"][0] == 0.0 and cut["energy_download_j"][0] == full["energy_download_j"][0]
    assert cut["energy_j"][1] == full["energy_j"][1]
    # 12 J empties in the download's tail (at the download's end), 20 J in the upload's; 1 MJ lasts
    at = empties_at(profiles, [0, 0, 1], client_times(profiles, [0, 0, 1], 1e6, 1e6, 1e9), [12.0, 20.0, 1e6])
    np.testing.assert_allclose(at, [0.44, 0.44 + 0.125 + 1.64, np.inf])
    at = empties_at(profiles, [0], client_times(profiles, [0], 1e6, 1e6, 1e9), [(0.3 + 1.3) * 0.44 + 12.0 + 3.5 * 0.1])
    np.testing.assert_allclose(at, [0.54])  # 0.1 s into training


BATTERY = CONDITIONS + ", battery: {%s}"


def _levels_replay(run, capacity: pd.Series, spec: dict):
    """battery_level_end from battery_level, the ledger and the round's length."""
    c = run.clients.merge(run.rounds[["round", "sim_round_s"]], on="round")
    c = c[c["battery_level"].notna()]
    cap = c["client_id"].map(capacity) * 3600.0
    spent = c["energy_j"].fillna(0.0)
    gain = np.where(c["on_charger"], spec.get("charge_w", 10.0) * c["sim_round_s"], 0.0)
    want = np.clip(c["battery_level"] + (gain - spent) / cap, 0.0, 1.0)
    want = np.where(c["drop_reason"] == "battery", np.where(c["sim_total_s"].notna(), 0.0, want), want)
    return c, want


@pytest.mark.parametrize("charging", ["never", "always"])
def test_battery_levels_follow_the_ledger_and_the_charger(tmp_path, charging):
    spec = {"start": "{low: 0.1, high: 0.9}", "threshold": 0.3, "charging": charging, "charge_w": 10.0}
    run = _run(tmp_path, charging, fleet=BATTERY % ", ".join(f"{k}: {v}" for k, v in spec.items()))
    profiles = run.profiles.set_index("client_id")
    c, want = _levels_replay(run, profiles["battery_wh"], spec)
    assert set(c["tier"]) == {"phone_low", "laptop_cpu"}  # rpi4 is mains-powered: no level
    assert run.clients.loc[run.clients["tier"] == "rpi4", "battery_level"].isna().all()
    np.testing.assert_allclose(c["battery_level_end"], want, rtol=1e-9, atol=1e-12)
    # the threshold: below it a selected client sits the round out (unless it was offline anyway)
    low = c["battery_level"] < 0.3
    assert (c.loc[low, "drop_reason"].isin(["battery", "unavailable"])).all()
    assert (c.loc[~low, "drop_reason"] != "battery").all()
    r = run.rounds.set_index("round")
    assert (r["num_battery"] == c[c["drop_reason"] == "battery"].groupby("round").size()
            .reindex(r.index).fillna(0)).all()
    if charging == "never":
        assert low.sum() > 0 and (c["battery_level_end"] <= c["battery_level"] + 1e-15).all()
    else:
        idle = c[c["sim_total_s"].isna() & (c["battery_level"] < 1)]  # charging, spending nothing
        gained = idle[idle["sim_round_s"] > 0]
        assert len(gained) and (gained["battery_level_end"] > gained["battery_level"]).all()


def test_a_battery_that_runs_empty_mid_round_stops_its_client_there(tmp_path):
    # a 0.003 Wh battery (10.8 J) on 4g empties in the download's 12 J tail: at the download's end
    fleet = ("battery: {start: 1.0, threshold: 0.0, charging: never}, "
             "overrides: {0: {battery_wh: 0.003}, 1: {battery_wh: 0.003}, 2: {battery_wh: 0.003}}")
    run = _run(tmp_path, "r", "clients.participation=1.0", "clients.profiles.network={4g: 1.0}", fleet=fleet)
    c = run.clients
    emptied = c[c["client_id"].isin([0, 1, 2]) & (c["drop_reason"] == "battery") & (c["battery_level"] > 0)]
    assert len(emptied) >= 1
    for _, row in emptied.iterrows():
        assert row["battery_level_end"] == 0.0
        np.testing.assert_allclose(row["left_s"] - row["start_s"], row["sim_download_s"])
        assert row["energy_j"] < 10.8 and row["energy_upload_j"] == 0.0 and row["energy_train_j"] == 0.0
    mine = recompute(c, run.profiles)
    got = c[c["sim_total_s"].notna()][["round", "client_id", *COLUMNS]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, mine.reset_index(drop=True), rtol=1e-12, check_dtype=False)
    # at 0 Wh with a threshold of 0 it may start again, and stops at once
    again = c[c["client_id"].isin(emptied["client_id"]) & (c["battery_level"] == 0) & c["sim_total_s"].notna()]
    assert len(again) and (again["drop_reason"] == "battery").all() and (again["left_s"] == again["start_s"]).all()


def test_idle_drain_and_hours_on_the_charger(tmp_path):
    spec = "start: 0.5, threshold: 0.0, charging: hours, hours: [0, 12], idle_drain: true"
    run = _run(tmp_path, "r", "clock.start='11:59:59'", "rounds=12", "clock.deadline_s=0.119", fleet=BATTERY % spec)
    c = run.clients.merge(run.rounds[["round", "sim_round_s", "round_start_s"]], on="round")
    c = c[c["battery_level"].notna()]
    on = (c["round_start_s"] % 86400) < 12 * 3600
    assert on.any() and (~on).any()  # the run crosses noon
    assert (c["on_charger"] == on).all()
    off = c[~on & c["sim_total_s"].isna()]  # idle all round: pays idle_w for its length
    idle_w = off["client_id"].map(run.profiles.set_index("client_id")["idle_w"])
    cap = off["client_id"].map(run.profiles.set_index("client_id")["battery_wh"]) * 3600
    np.testing.assert_allclose(off["battery_level_end"], off["battery_level"] - idle_w * off["sim_round_s"] / cap)


def test_resume_continues_the_batteries_where_the_checkpoint_left_them(tmp_path):
    spec = "start: {low: 0.2, high: 0.6}, threshold: 0.25, charging: online, idle_drain: true"
    extra = ["rounds=6", "checkpoint.every=2", "clock.deadline_s=0.119"]
    ref = _run(tmp_path, "ref", *extra, fleet=BATTERY % spec)
    cfg = load_config(None, [*BASE, FLEET % (BATTERY % spec), *extra])
    path = tmp_path / "r"
    run_experiment(cfg, path, callbacks=[lambda rec: rec.round == 2])
    resume_run(path)
    got = load_run(path)
    drop = ["wall_s", "wall_fit_s"]
    for name in ("rounds", "clients"):
        a = getattr(got, name).drop(columns=drop, errors="ignore")
        b = getattr(ref, name).drop(columns=drop, errors="ignore")
        pd.testing.assert_frame_equal(a, b, obj=name)
    assert ref.clients["on_charger"].any() and (ref.clients["drop_reason"] == "battery").any()


@pytest.mark.parametrize("bad, message", [
    ({"start": 1.5}, r"battery\.start=1\.5 is not allowed.*\[0, 1\]"),
    ({"start": {"low": -0.1, "high": 0.5}}, r"battery\.start=-0\.1"),
    ({"threshold": 1.2}, r"battery\.threshold=1\.2 is not allowed.*above the capacity"),
    ({"charge_w": -1}, r"battery\.charge_w=-1\.0 is not allowed"),
    ({"hours": [22, 25]}, r"battery\.hours"),
    ({"charging": "sometimes"}, r"charging"),
])
def test_bad_battery_sections_are_refused_with_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        BatterySpec.model_validate(bad)
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, "clients.profiles.devices={phone_low: 1.0}",
                           f"clients.profiles.battery={bad}".replace("'", "")])


def test_bad_power_numbers_are_refused_with_the_field():
    with pytest.raises(ValueError, match=r"train_w=-2\.0 is not allowed: a power or energy must be >= 0"):
        load_catalog({"devices": {"rpi4": {"train_w": -2}}})
    with pytest.raises(ValueError, match=r"battery_wh=-1\.0 is not allowed: must be >= 0"):
        load_catalog({"devices": {"rpi4": {"battery_wh": -1}}})
    with pytest.raises(ValueError, match=r"tail_j=-1\.0"):
        load_catalog({"networks": {"4g": {"tail_j": -1}}})
    with pytest.raises(ValueError, match=r"client 3: rx_w=-0\.5"):
        assign_profiles({"overrides": {3: {"rx_w": -0.5}}}, 5, 0)


def test_a_battery_section_needs_batteries_and_known_power(tmp_path):
    with pytest.raises(ValueError, match="no client has a battery"):
        _run(tmp_path, "a", "clients.profiles.devices={rpi4: 1.0}", fleet="battery: {}")
    catalog = "catalog: {devices: {board: {gflops: 2, memory_gb: 1, availability: 1, dropout: 0, battery_wh: 5}}}"
    with pytest.raises(ValueError, match=r"tier 'board'.*no complete power model"):
        _run(tmp_path, "b", "clients.profiles.devices={board: 1.0}", fleet=f"battery: {{}}, {catalog}")


def test_a_tier_without_power_numbers_has_unknown_not_zero_energy(tmp_path):
    catalog = "catalog: {devices: {board: {gflops: 2, memory_gb: 1, availability: 1, dropout: 0}}}"
    run = _run(tmp_path, "r", "clients.profiles.devices={board: 0.5, rpi4: 0.5}", fleet=catalog)
    c = run.clients[run.clients["sim_total_s"].notna()]
    assert c.loc[c["tier"] == "board", "energy_train_j"].isna().all()
    assert (c.loc[c["tier"] == "rpi4", "energy_train_j"] > 0).all()
    assert run.rounds["energy_j"].isna().any()  # a fleet total with unknowns is unknown


def test_compare_and_the_report_show_energy_to_target(tmp_path):
    from hetsim.compare import compare_table, load_entries
    from hetsim.report import build_report
    from hetsim.report_energy import energy_to_target

    a = _run(tmp_path, "a", fleet=BATTERY % "start: 0.5, threshold: 0.3")
    b = _run(tmp_path, "b", "clients.profiles.network={wifi: 1.0}", fleet=CONDITIONS)
    table, target = compare_table(load_entries([a.path, b.path]), "global_acc", 0.3)
    for run, row in zip((a, b), table.itertuples()):
        r = run.rounds
        first = r.index[r["global_acc"] >= 0.3]
        want = r["energy_j"].cumsum()[first[0]] if len(first) else np.nan
        np.testing.assert_allclose(row.energy_to_target_j, want)
        assert row.energy_j == pytest.approx(r["energy_j"].sum())
        assert energy_to_target(r, "global_acc", 2.0) != energy_to_target(r, "global_acc", 2.0)  # NaN
    assert table["energy_to_target_j"].notna().all()
    assert table.loc[1, "energy_j"] < table.loc[0, "energy_j"] / 10  # Wi-Fi has no LTE tails
    out = build_report(a.path, tmp_path / "a.html").read_text()
    assert "<h2>Energy</h2>" in out
    for fig_id in ("fig-energy-accuracy", "fig-energy-tiers", "fig-energy-battery", "table-energy-summary"):
        assert f'id="{fig_id}"' in out, fig_id
