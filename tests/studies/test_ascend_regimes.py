"""The regime table of studies/ascend_regimes.py against the clock's and the compressors' own
numbers: per-arm seconds = clock.client_times for the same work, payload bytes = nbytes. No runs."""
import numpy as np
import pytest
import torch

from studies import ascend_regimes as regimes


@pytest.mark.parametrize("arm", regimes.ARMS)
def test_payload_bytes_are_the_compressors_own(arm):
    from algorithms.compressors import compress

    d, k = 5000, 50
    c = compress(arm, torch.randn(d), k, seed=3, round=2)
    assert regimes.payload_bytes(arm, k) == c.nbytes


@pytest.mark.parametrize("arm", regimes.ARMS)
def test_arm_seconds_equal_the_clocks_per_client_seconds(arm):
    from hardware_profiles import clock
    from hardware_profiles.sampler import ProfileTable

    d, fps, ratio, samples = 586_250, 49_182_720, 0.1, 16  # cifar_cnn, one step of 16
    prof = regimes.profile_for("rpi4", "down500/up5")
    k = round(ratio * d)
    select = clock.select_seconds(arm, d, k, prof)
    t = clock.client_times(ProfileTable.from_profiles([prof]), [0], bytes_down=4 * d,
                           bytes_up=regimes.payload_bytes(arm, k), train_flops=samples * fps,
                           compress_ops=clock.ops_for_seconds(select, prof.gflops))
    ph = regimes.arm_phases(arm, d, fps, ratio, samples, prof)
    for ours, theirs in (("download_s", "download_s"), ("train_s", "compute_s"), ("select_s", "compress_s"),
                         ("upload_s", "upload_s"), ("total_s", "total_s")):
        assert ph[ours] == pytest.approx(float(t[theirs][0]), rel=1e-12), ours


def test_the_table_bounds_topk_over_randomk_by_its_payload_ratio():
    table = regimes.arm_table(tiers=("rpi4", "phone_low"))
    # Top-K sends 2x Random-K's bytes, so its round is at most ~2x, plus the selection's share
    assert (table["topk_over_randomk"] < 2.0 + table["topk_select_share"] * 2.0).all()
    assert (table["topk_over_randomk"] >= 1.0).all()
    slow_up = table[(table["link"] == "down500/up5") & (table["k_ratio"] == 0.1)
                    & (table["local_samples"] == 16) & (table["model"].str.startswith("cifar_cnn"))]
    assert np.all(slow_up["topk_over_randomk"] > 1.4)  # the regime the cells run in


def test_auc_on_is_the_mean_of_the_step_curve_over_the_budget():
    # chance (0.1) until t = 1, then 0.5 until t = 3, then 0.9 until the budget 4; a round after it is cut
    assert regimes.auc_on([1.0, 3.0, 5.0], [0.5, 0.9, 1.0], 4.0) == pytest.approx((0.1 + 2 * 0.5 + 0.9) / 4)
