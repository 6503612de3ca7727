"""ASCEND's reward: the pure functions of each version (v1-v4), the time they normalise by, and
how a client closes the reward of its previous upload at its next participation.

No state of its own: the client (:mod:`algorithms.ascend_client`) keeps the pending reward in the
client's state and calls these; the formulas are in docs/ascend.md, "Reward".
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.ascend_time import measured_costs, measured_seconds, round_seconds
from algorithms.params import AscendParams
from hardware_profiles import clock

FIDELITY_REWARDS = ("v3", "v4")  # the rewards of local and knowledge fidelity (v4: v3 with T_exp for T̄)

# the reward closed at a participation (for the client's previous upload), every part
REWARD_COLUMNS = ("reward", "reward_raw", "reward_g", "reward_df", "reward_dd", "reward_phi", "reward_psi",
                  "reward_rho", "reward_factor", "reward_T", "reward_tbar")
# v3's terms of this round's upload (fit), NaN for v1/v2
V3_COLUMNS = ("phi", "psi", "progress_g", "reward_sent", "probe_loss_full", "kl_full_w", "kl_full_sent",
              "sim_T_select", "sim_T_measure")


def closed_none() -> dict[str, Any]:
    out: dict[str, Any] = {c: math.nan for c in REWARD_COLUMNS}
    out.update(reward_arm="", reward_round=-1, reward_fed=False, reward_lost=False)
    return out



def relative_decrease(before: float, after: float) -> float:
    """``(before - after) / before``; 0 when ``before`` is not a positive finite number
    (nothing to normalise by), ``-inf`` when ``after`` is not finite (divergence)."""
    if not (math.isfinite(before) and before > 1e-12):
        return 0.0
    if not math.isfinite(after):
        return -math.inf
    return (before - after) / before


def _clip(r: float, clip: float) -> float:
    if math.isnan(r):
        r = -math.inf
    return float(min(clip, max(-clip, r)))


def ascend_reward_v1(df: float, dd: float, T: float, T_bar: float, rho: float = 0.6, clip: float = 1.0) -> float:
    """Version 1: ``clip((rho*dd + (1-rho)*df) / (T / T_bar), [-clip, clip])`` (T/T̄ taken as 1
    if undefined)."""
    ratio = T / T_bar if (math.isfinite(T) and math.isfinite(T_bar) and T > 0 and T_bar > 0) else 1.0
    return _clip((rho * dd + (1.0 - rho) * df) / ratio, clip)


def time_factor(g: float, T: float, T_bar: float) -> float:
    """Sign-aware normalisation factor: ``T̄/T`` for progress (``g >= 0``), ``T/T̄`` for regress,
    so that a faster arm earns more for progress and loses less for regress (1 if undefined)."""
    if not (math.isfinite(T) and math.isfinite(T_bar) and T > 0 and T_bar > 0):
        return 1.0
    return T_bar / T if g >= 0 else T / T_bar


def reward_v2(df: float, dd: float, T: float, T_bar: float, rho: float = 0.5, clip: float = 1.0) -> dict[str, float]:
    """Version 2 of the reward, every part: ``rho_eff`` (0 when ``dd`` is NaN: no teacher yet),
    ``g = rho_eff*dd + (1-rho_eff)*df``, the time ``factor``, ``raw = g*factor`` and the clipped
    ``reward``."""
    rho_eff = rho if not math.isnan(dd) else 0.0
    g = (rho_eff * dd if rho_eff > 0 else 0.0) + (1.0 - rho_eff) * df
    factor = time_factor(g, T, T_bar)
    raw = g * factor
    return {"reward": _clip(raw, clip), "reward_raw": raw, "reward_g": g, "reward_rho": rho_eff,
            "reward_factor": factor}


def local_fidelity(f_w: float, f_full: float, f_sent: float) -> float:
    """v3's ``phi = (f(w) - f(w+Δ̂)) / max(f(w) - f(w+Δ), ε_f)``, ``ε_f = 1e-3·f(w)``, clipped to
    [-1, 1]: the share of the fresh update's loss decrease that the update sent keeps. 0 when the
    fresh update did not lower the loss by more than ε_f (nothing to keep) or f(w) is not finite."""
    if not math.isfinite(f_w):
        return 0.0
    eps = 1e-3 * abs(f_w)
    full = f_w - f_full
    if not (full > eps):  # NaN too
        return 0.0
    return _clip((f_w - f_sent) / full, 1.0)


def knowledge_fidelity(kl_full_sent: float, kl_full_w: float, eps: float = 1e-6) -> float:
    """v3's ``psi = 1 - KL(p_{w+Δ} ‖ p_{w+Δ̂}) / max(KL(p_{w+Δ} ‖ p_w), ε_k)``, clipped to [-1, 1]:
    how much of the change the client's training made to its predictions on the public probe
    survives compression (NaN -> -1)."""
    return _clip(1.0 - kl_full_sent / max(kl_full_w, eps), 1.0)


def reward_v3(phi: float, psi: float, T: float, T_bar: float, rho: float = 0.6, kappa: float = 1.0,
              clip: float = 1.0) -> dict[str, float]:
    """Version 3: ``g = rho·psi + (1-rho)·phi`` (each clipped to [-1, 1] first), the time
    ``factor = (T̄/T)^kappa`` for ``g >= 0`` and ``(T/T̄)^kappa`` for ``g < 0``, ``raw = g·factor``
    and the clipped ``reward``."""
    phi, psi = _clip(phi, 1.0), _clip(psi, 1.0)
    g = rho * psi + (1.0 - rho) * phi
    factor = time_factor(g, T, T_bar) ** kappa
    raw = g * factor
    return {"reward": _clip(raw, clip), "reward_raw": raw, "reward_g": g, "reward_rho": rho,
            "reward_factor": factor, "reward_phi": phi, "reward_psi": psi}


def reward_v4(phi: float, psi: float, T: float, T_exp: float, rho: float = 0.6, kappa: float = 1.0,
              clip: float = 1.0) -> dict[str, float]:
    """Version 4 (docs/ascend.md, "Reward v4"): v3 with the client's running mean ``T̄`` replaced by
    ``T_exp``, the client's mean work so far priced at the present link and compute rates
    (:func:`algorithms.ascend_time.expected_seconds`): ``factor = (T_exp/T)^kappa`` for ``g >= 0``,
    ``(T/T_exp)^kappa`` for ``g < 0``. The parts are v3's, plus ``reward_texp``."""
    parts = reward_v3(phi, psi, T, T_exp, rho, kappa, clip)
    parts["reward_texp"] = T_exp
    return parts


def selection_seconds(profile: Any, arm: str, d: int, k: int, ops: float, in_seconds: bool) -> tuple[float, float]:
    """``(T_select, op count to report)``. ``in_seconds`` (selection cost v3): the device tier's
    ns constants (``clock.select_seconds``), reported as the op count the clock prices at exactly
    those seconds; otherwise, or when the tier does not give them, the compressor's op count."""
    if in_seconds:
        t = clock.select_seconds(arm, d, k, profile)
        if math.isfinite(t):
            return float(t), float(clock.ops_for_seconds(t, profile.gflops))
    return float(clock.compress_seconds(ops, profile.gflops)), float(ops)


def simulated_seconds(profile: Any, train_flops: float, compress_ops: float, bytes_up: int) -> float:
    """``T = T_train + T_select + T_upload`` (upload latency included): the virtual clock's own
    formulas (hardware_profiles.clock) on the client's profile — what the engine computes."""
    if profile is None:
        raise ValueError("ASCEND's reward needs ctx.profile (the client's hardware profile)")
    t = (
        clock.compute_seconds(train_flops, profile.gflops)
        + clock.compress_seconds(compress_ops, profile.gflops)
        + clock.transfer_seconds(bytes_up, profile.up_mbps, profile.latency_s)
    )
    return float(t)


def kl_teacher_student(teacher_logits: torch.Tensor, student_logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``KL(softmax(t/tau) ‖ softmax(s/tau))``, mean over samples."""
    t = F.log_softmax(teacher_logits / tau, dim=1)
    s = F.log_softmax(student_logits / tau, dim=1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


@torch.no_grad()
def logits_of(model: torch.nn.Module, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    model.eval()
    if len(x) <= batch_size:
        return model(x)
    return torch.cat([model(x[s : s + batch_size]) for s in range(0, len(x), batch_size)])


# ------------------------------------------------------------------------------------------------
# closing the previous upload's reward (at the next participation)
# ------------------------------------------------------------------------------------------------
def close_v1(p: AscendParams, st, meta, pending, f_now: float, d_now: float) -> dict[str, Any]:
    """Version 1: the change of the global model between the two participations."""
    d_before = float(meta.get("probe_kl", {}).get(pending["round"], pending["D"]))
    df = relative_decrease(pending["f"], f_now)
    dd = relative_decrease(d_before, d_now) if math.isfinite(d_now) else 0.0
    t_bar = float(np.mean(st["T_warm"]))
    r = ascend_reward_v1(df, dd, pending["T"], t_bar, p.rho_value, p.reward_clip)
    return {"reward": r, "reward_df": df, "reward_dd": dd, "reward_tbar": t_bar, "reward_rho": p.rho_value}


def close_v2(p: AscendParams, client_id: int, meta, pending) -> dict[str, Any]:
    """Version 2: the upload's own Δf (measured at fit) and ΔD (from the server, in the
    broadcast), or −clip for an upload that did not arrive."""
    if pending.get("lost"):
        return {"reward": -p.reward_clip, "reward_df": pending["df"], "reward_tbar": pending["tbar"],
                "reward_lost": True}
    entry = meta.get("dd", {}).get(client_id)
    dd = float(entry[1]) if entry is not None and int(entry[0]) == pending["round"] else math.nan
    parts = reward_v2(pending["df"], dd, pending["T"], pending["tbar"], p.rho_value, p.reward_clip)
    parts.update(reward_df=pending["df"], reward_dd=dd, reward_tbar=pending["tbar"])
    return parts


def extra_closed(p: AscendParams) -> dict[str, Any]:
    """The closed reward's columns of v4 (``reward_texp``) and ``time_model: measured``
    (``reward_measured``), present only when they apply (v3's tables stay as they were)."""
    out: dict[str, Any] = {"reward_texp": math.nan} if p.reward == "v4" else {}
    if p.time_model == "measured":
        out["reward_measured"] = False
    return out


def close_v3(p: AscendParams, st, pending, last: dict[str, float] | None = None) -> dict[str, Any]:
    """Versions 3 and 4: the reward computed at the upload (``fit``: nothing comes from the
    server), or −clip if the upload did not arrive. ``time_model: measured``: recomputed with
    the clock's phase times of that round (``last``, from the engine) when they are there."""
    parts = dict(pending["parts"])
    if p.time_model == "measured" and last is not None and int(last["round"]) == pending["round"]:
        parts.update(measured_parts(p, st, pending, last))
    if pending.get("lost"):
        parts.update(reward=-p.reward_clip, reward_lost=True)
    return parts


def measured_parts(p: AscendParams, st, pending, last: dict[str, float]) -> dict[str, Any]:
    """``time_model: measured``: T = the round's measured phase times (the compute phase's
    training share); v3: T̄ = the running mean of the measured T; v4: T_exp = the client's mean
    work (as it was at that round) priced at the unit costs those phase times imply."""
    pp = pending["parts"]
    share, lat = pending["train_share"], pending["latency"]
    T = measured_seconds(last, share)
    st["Tm_sum"] += T
    st["Tm_count"] += 1
    if p.reward == "v4":
        costs = measured_costs(last, pending["work"], lat, share)
        t_exp = float(round_seconds(pending["wbar"], costs, lat))
        parts = reward_v4(pp["reward_phi"], pp["reward_psi"], T, t_exp, p.rho_value, p.kappa, p.reward_clip)
    else:
        t_bar = st["Tm_sum"] / st["Tm_count"]
        parts = reward_v3(pp["reward_phi"], pp["reward_psi"], T, t_bar, p.rho_value, p.kappa, p.reward_clip)
        parts["reward_tbar"] = t_bar
    parts.update(reward_T=T, reward_measured=True)
    return parts
