"""ASCEND: adaptive heterogeneous compression for federated knowledge distillation.

Spec: ``/work/shared/specs/ascend.md`` (Liu et al., 2026; version 3, the default, with
versions 1 and 2 selectable: ``reward: v1|v2|v3``). Method doc: ``docs/ascend.md``.

What is here: the method's two halves, :class:`AscendClient` (bandit choice of a compressor per
round, the reward of each version) and :class:`AscendServer` (per-architecture aggregation,
distillation towards a teacher, the rollback guard), the reward functions they share, and ``SPEC``.

Deliberately not here: the bandit policies (:mod:`algorithms.bandits`), the compressors and
error feedback (:mod:`algorithms.compressors`), the hyperparameters' validation
(:mod:`algorithms.params`), Ray and file I/O. How the method works (FedKD base, the three reward
versions, a round on the client and on the server, its state) is in docs/ascend.md, "Design notes".

Over 400 lines because it is one method, both halves and the reward versions they share, in the
order of the spec's sections; its bandits and compressors are modules of their own.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.ascend_time import (
    expected_seconds,
    measured_costs,
    measured_seconds,
    round_seconds,
    work_vector,
)
from algorithms.ascend_time import unit_costs as profile_costs
from algorithms.asynchronous import apply_states
from algorithms.bandits import EpsilonGreedyEMA, Exp3, FixedArm, forced
from algorithms.base import (
    AlgorithmSpec,
    Broadcast,
    ClientContext,
    ClientResult,
    Payload,
    Server,
    ServerContext,
    TimingUnsupported,
)
from algorithms.compressed_fedavg import (
    CompressedFedAvgClient,
    apply_compressed_updates,
    buffer_upload,
    compressed_payload,
    decode_upload,
)
from algorithms.compressors import COMPRESSORS
from algorithms.fedavg import state_payload
from algorithms.params import DEFAULT_ARMS, AscendParams, parse_arm  # noqa: F401 (DEFAULT_ARMS re-exported)
from algorithms.training import (
    Adam,
    flat_params,
    flat_state,
    load_flat_params,
    load_flat_state,
    local_sgd,
    same_bits,
)
from hardware_profiles import clock

FORCED_ARM = "topk"  # [paper] the arm a rollback forces
FORWARD_FRACTION = 1.0 / 3.0  # forward pass ~ 1/3 of a training step (probe-loss evaluation cost)
CONTROL_VALUE_BYTES = 4  # each number of the broadcast's control meta travels as 32 bits
FIDELITY_REWARDS = ("v3", "v4")  # the rewards of local and knowledge fidelity (v4: v3 with T_exp for T̄)

PROBE_SALT = 0xA5CE  # local probe set
PUBLIC_PROBE_SALT = 0x9B0B  # server's public probe subset
DISTILL_SALT = 0xD157  # distillation batches


# ------------------------------------------------------------------------------------------------
# reward (pure functions)
# ------------------------------------------------------------------------------------------------
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
# client
# ------------------------------------------------------------------------------------------------
def q_columns(arms: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``q_<arm>`` trace columns: one per registered compressor (a fixed schema whatever the
    arms), plus one per joint (compressor, K) arm label of ``arms``."""
    return tuple(f"q_{a}" for a in dict.fromkeys([*COMPRESSORS, *arms]))


# the reward closed at a participation (for the client's previous upload), every part
REWARD_COLUMNS = ("reward", "reward_raw", "reward_g", "reward_df", "reward_dd", "reward_phi", "reward_psi",
                  "reward_rho", "reward_factor", "reward_T", "reward_tbar")
# v3's terms of this round's upload (fit), NaN for v1/v2
V3_COLUMNS = ("phi", "psi", "progress_g", "reward_sent", "probe_loss_full", "kl_full_w", "kl_full_sent",
              "sim_T_select", "sim_T_measure")


def _closed_none() -> dict[str, Any]:
    out: dict[str, Any] = {c: math.nan for c in REWARD_COLUMNS}
    out.update(reward_arm="", reward_round=-1, reward_fed=False, reward_lost=False)
    return out


def policy_values(policy: Any, arms: tuple[str, ...] = ()) -> dict[str, float]:
    """``q_<arm>`` trace columns (those of ``arms``, the run's arms, too): epsilon-greedy's Q
    (warm-up running means until the warm-up ends), EXP3's arm probabilities, NaN for a fixed
    arm / arms not in the set."""
    out = {c: math.nan for c in q_columns(tuple(arms))}
    if isinstance(policy, EpsilonGreedyEMA):
        if policy.warmed_up:
            vals = policy.q
        else:
            cnt = policy.warmup_count
            vals = np.where(cnt > 0, policy.warmup_sum / np.maximum(cnt, 1), np.nan)
    elif isinstance(policy, Exp3):
        vals = policy.probabilities()
    else:
        return out
    for arm, v in zip(policy.arms, vals):
        out[f"q_{arm}"] = float(v)
    return out


def rolled_back(round: int, client_id: int, meta: dict[str, Any]) -> bool:
    """Whether the server discarded this client's upload of ``round``: a synchronous rollback
    names the round (``rolled_back``), an asynchronous one each discarded update by (client,
    wave) (``rolled_back_updates``: the other clients of that wave may have been applied)."""
    return (round in set(meta.get("rolled_back", ()))
            or [client_id, round] in meta.get("rolled_back_updates", []))


class AscendClient(CompressedFedAvgClient):
    """Per-client state (``ctx.state``, plain data): ``residual`` (float32), ``sent`` (this
    round's payload arrays, for ``on_dropped``), ``policy`` (a bandit dataclass), ``T_sum`` /
    ``T_count`` (v2: the running mean T̄) or ``T_warm`` (v1), ``pending`` (the reward to close at
    the next participation), ``undo`` (what to restore if this upload's round is rolled back)
    and ``round_info`` (receive -> fit); v4: ``W_sum`` / ``W_count`` (the client's work so far, for T_exp);
    ``time_model: measured``: ``Tm_sum`` / ``Tm_count`` (the running mean of the measured T)."""

    params: AscendParams
    needs_profile = True  # the reward's T is the client's simulated time

    def __init__(self, params: AscendParams):
        super().__init__(params)
        # v3: the received model's public logits, by architecture: (state, inputs, logits)
        self._received_logits: dict[Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._probe_memo: tuple[Any, torch.Tensor | None] = (None, None)  # the last client's probe rows

    def received_logits(self, ctx: ClientContext, x: torch.Tensor) -> torch.Tensor:
        """``logits_of(ctx.model, x)`` of the model as received. Every client of an architecture
        receives the same global state in a round, so the forward runs once per architecture and
        round: it is reused when the model's state and ``x`` are bit for bit those it ran on."""
        key = (ctx.arch, type(ctx.model), x.device)
        state = flat_state(ctx.model)
        hit = self._received_logits.get(key)
        if hit is not None and same_bits(hit[0], state) and same_bits(hit[1], x):
            ctx.model.eval()  # as logits_of leaves it
            return hit[2]
        z = logits_of(ctx.model, x)
        self._received_logits[key] = (state, x, z)
        return z

    @classmethod
    def reads_phase_times(cls, params: AscendParams) -> bool:
        return params.time_model == "measured"

    def new_policy(self, rng: np.random.Generator | None = None):
        """The client's policy; v3's warm-up order is a permutation of the arms drawn from ``rng``
        (the client's generator at its first participation: random per client, reproducible
        from the seed), played in blocks."""
        p = self.params
        if p.policy == "egreedy":
            v3 = p.reward in FIDELITY_REWARDS
            if v3 and rng is None:
                raise ValueError("reward v3's warm-up order needs the client's generator")
            return EpsilonGreedyEMA(
                list(p.arms), warmup=p.warmup, c=p.eps_c, eps_min=p.eps_min,
                epsilon_fixed=p.epsilon, lam=p.ema_lambda, mean=p.q_update == "mean",
                order=rng.permutation(len(p.arms)).tolist() if v3 else None, blocks=v3,
            )
        if p.policy == "exp3":
            return Exp3(list(p.arms), gamma=p.exp3_gamma)
        return FixedArm(p.arm)

    def sync_policy_params(self, policy) -> None:
        """The config's exploration settings win over those a restored policy carries (a state
        restored under new hyperparameters, e.g. Population Based Training changing epsilon);
        the learned values (Q, counts) stay. A no-op when the config is the one it was built with."""
        p = self.params
        if isinstance(policy, EpsilonGreedyEMA):
            policy.c, policy.eps_min, policy.epsilon_fixed, policy.lam = p.eps_c, p.eps_min, p.epsilon, p.ema_lambda
            policy.mean = p.q_update == "mean"
        elif isinstance(policy, Exp3):
            policy.gamma = p.exp3_gamma

    def probe_indices(self, ctx: ClientContext) -> torch.Tensor:
        """A fixed subset of the local training data (same every round for this client); v3
        holds it out of training, so it is at most ``probe_fraction`` of the data."""
        n = len(ctx.train_y)
        m = min(n, self.params.probe_batches * ctx.train.batch_size)
        if self.params.reward in FIDELITY_REWARDS:
            m = min(m, int(self.params.probe_fraction * n))
        key = (ctx.client_id, n, m, ctx.train_x.device)
        if self._probe_memo[0] != key:  # asked 5 times in a client's round: drawn once
            rng = np.random.default_rng([PROBE_SALT, ctx.client_id, n])
            self._probe_memo = (key, torch.from_numpy(np.sort(rng.permutation(n)[:m])).to(ctx.train_x.device))
        return self._probe_memo[1]

    @torch.no_grad()
    def probe_loss(self, ctx: ClientContext) -> tuple[float, int]:
        idx = self.probe_indices(ctx)
        if len(idx) == 0:
            return math.nan, 0
        ctx.model.eval()
        loss = F.cross_entropy(ctx.model(ctx.train_x[idx]), ctx.train_y[idx])
        return float(loss), len(idx)

    def receive(self, ctx: ClientContext, broadcast: Payload) -> None:
        super().receive(ctx, broadcast)  # dense global state (+ local buffers)
        p, st, meta = self.params, ctx.state, broadcast.meta
        if "policy" not in st:
            st["policy"] = self.new_policy(ctx.rng)
            st["T_warm"], st["T_sum"], st["T_count"] = [], 0.0, 0
        else:
            self.sync_policy_params(st["policy"])
        if p.reward == "v4" and "W_sum" not in st:  # (also a state restored under another config)
            st["W_sum"], st["W_count"] = np.zeros(4), 0  # the client's work so far (ascend_time.WORK_FIELDS)
        if p.time_model == "measured" and "Tm_sum" not in st:
            st["Tm_sum"], st["Tm_count"] = 0.0, 0  # v3, measured: the running mean of the measured T
        restored = math.nan
        undo = st.get("undo")
        if undo is not None and rolled_back(undo["round"], ctx.client_id, meta):
            # lazy rollback: this client's last upload was discarded by the server
            if undo["residual"] is None:
                st.pop("residual", None)
            else:
                st["residual"] = undo["residual"]
            st["policy"] = undo["policy"]
            st.pop("pending", None)  # the rolled-back round's reward is never fed to the policy
            del st["undo"]
            restored = undo["round"]
        f_now, n_probe = self.probe_loss(ctx)
        d_now = float(meta.get("probe_kl", {}).get(ctx.round, math.nan))  # v1 only
        closed = {**_closed_none(), **self._extra_closed()}
        pending = st.pop("pending", None)
        if pending is not None:
            if p.reward == "v1":
                parts = self._close_v1(st, meta, pending, f_now, d_now)
            elif p.reward == "v2":
                parts = self._close_v2(ctx.client_id, meta, pending)
            else:
                parts = self._close_v3(st, pending, ctx.last_times)
            fed = pending["reason"] != "forced" or p.learn_from_forced
            if fed:
                st["policy"].update(pending["arm"], parts["reward"])
            closed.update(parts)
            closed.update(reward_T=parts.get("reward_T", pending["T"]), reward_arm=pending["arm"],
                          reward_round=pending["round"], reward_fed=fed)
        st["round_info"] = {
            "round": ctx.round, "f": f_now, "n_probe": n_probe, "D": d_now,
            "restored_round": restored, "closed": closed,
        }

    def _close_v1(self, st, meta, pending, f_now: float, d_now: float) -> dict[str, Any]:
        """Version 1: the change of the global model between the two participations."""
        p = self.params
        d_before = float(meta.get("probe_kl", {}).get(pending["round"], pending["D"]))
        df = relative_decrease(pending["f"], f_now)
        dd = relative_decrease(d_before, d_now) if math.isfinite(d_now) else 0.0
        t_bar = float(np.mean(st["T_warm"]))
        r = ascend_reward_v1(df, dd, pending["T"], t_bar, p.rho_value, p.reward_clip)
        return {"reward": r, "reward_df": df, "reward_dd": dd, "reward_tbar": t_bar, "reward_rho": p.rho_value}

    def _close_v2(self, client_id: int, meta, pending) -> dict[str, Any]:
        """Version 2: the upload's own Δf (measured at fit) and ΔD (from the server, in the
        broadcast), or −clip for an upload that did not arrive."""
        p = self.params
        if pending.get("lost"):
            return {"reward": -p.reward_clip, "reward_df": pending["df"], "reward_tbar": pending["tbar"],
                    "reward_lost": True}
        entry = meta.get("dd", {}).get(client_id)
        dd = float(entry[1]) if entry is not None and int(entry[0]) == pending["round"] else math.nan
        parts = reward_v2(pending["df"], dd, pending["T"], pending["tbar"], p.rho_value, p.reward_clip)
        parts.update(reward_df=pending["df"], reward_dd=dd, reward_tbar=pending["tbar"])
        return parts

    def _extra_closed(self) -> dict[str, Any]:
        """The closed reward's columns of v4 (``reward_texp``) and ``time_model: measured``
        (``reward_measured``), present only when they apply (v3's tables stay as they were)."""
        out: dict[str, Any] = {"reward_texp": math.nan} if self.params.reward == "v4" else {}
        if self.params.time_model == "measured":
            out["reward_measured"] = False
        return out

    def _close_v3(self, st, pending, last: dict[str, float] | None = None) -> dict[str, Any]:
        """Versions 3 and 4: the reward computed at the upload (``fit``: nothing comes from the
        server), or −clip if the upload did not arrive. ``time_model: measured``: recomputed with
        the clock's phase times of that round (``last``, from the engine) when they are there."""
        parts = dict(pending["parts"])
        if self.params.time_model == "measured" and last is not None and int(last["round"]) == pending["round"]:
            parts.update(self._measured_parts(st, pending, last))
        if pending.get("lost"):
            parts.update(reward=-self.params.reward_clip, reward_lost=True)
        return parts

    def _measured_parts(self, st, pending, last: dict[str, float]) -> dict[str, Any]:
        """``time_model: measured``: T = the round's measured phase times (the compute phase's
        training share); v3: T̄ = the running mean of the measured T; v4: T_exp = the client's mean
        work (as it was at that round) priced at the unit costs those phase times imply."""
        p, pp = self.params, pending["parts"]
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

    def fit(self, ctx: ClientContext, broadcast: Payload) -> ClientResult:
        p, st = self.params, ctx.state
        info = st.pop("round_info", None)
        if info is None or info["round"] != ctx.round:
            raise RuntimeError("AscendClient.fit called without receive() for this round")
        v3 = p.reward in FIDELITY_REWARDS
        start = flat_params(ctx.model)
        z_w = x_pub = None
        if v3:
            x_pub = self.public_probe(ctx, broadcast)
            z_w = self.received_logits(ctx, x_pub)
        loss, seen = local_sgd(self.training_context(ctx))
        delta = flat_params(ctx.model) - start

        policy = st["policy"]
        residual = st.get("residual")
        undo = {
            "round": ctx.round,
            "residual": None if residual is None else residual.copy(),
            "policy": copy.deepcopy(policy),
        }
        eps = policy.epsilon() if isinstance(policy, EpsilonGreedyEMA) else (
            p.exp3_gamma if isinstance(policy, Exp3) else math.nan
        )
        if broadcast.meta.get("forced", False):
            label, reason = forced(FORCED_ARM)
        else:
            label, reason = policy.choose(ctx.rng)
        arm, arm_k = parse_arm(label)
        v3_parts = {c: math.nan for c in V3_COLUMNS}
        v4_parts = {"sim_Texp": math.nan} if p.reward == "v4" else {}
        f_full = z_full = None
        forwards = info["n_probe"]
        if v3:  # the fresh update's own probe loss and public logits, before it is compressed
            f_full, n = self.probe_loss(ctx)
            z_full = logits_of(ctx.model, x_pub)
            forwards += n + 2 * len(x_pub)
        c, res_norm = self.compress_delta(ctx, delta, arm, k=arm_k)

        extra = buffer_upload(ctx.model, p.buffers, st)
        upload = compressed_payload(c, extra, arm_reason=reason)

        f_sent = df = math.nan
        if p.reward != "v1":  # the local term of the update actually sent, right away
            load_flat_params(ctx.model, start + c.dense())
            f_sent, n = self.probe_loss(ctx)
            forwards += n
            df = relative_decrease(info["f"], f_sent)
        if v3:
            z_sent = logits_of(ctx.model, x_pub)
            forwards += len(x_pub)
        pf = ctx.profile
        if pf is None:
            raise ValueError("ASCEND's reward needs ctx.profile (the client's hardware profile)")
        t_select, ops = selection_seconds(pf, arm, c.numel, c.k, c.ops, p.seconds_pricing)
        measure_flops = ctx.flops_per_sample * FORWARD_FRACTION * forwards
        train_flops = ctx.flops_per_sample * (seen + FORWARD_FRACTION * forwards)
        pending: dict[str, Any] = {"round": ctx.round, "arm": label, "reason": reason}
        if v3:
            # T of the spec: the measurement forwards are charged to the clock, not to the arm
            T = float(clock.transfer_seconds(broadcast.nbytes, pf.down_mbps, pf.latency_s)
                      + clock.compute_seconds(ctx.flops_per_sample * seen, pf.gflops) + t_select
                      + clock.transfer_seconds(upload.nbytes, pf.up_mbps, pf.latency_s))
            st["T_sum"] += T
            st["T_count"] += 1
            t_bar = st["T_sum"] / st["T_count"]
            tau = p.temperature
            kl_fw = float(kl_teacher_student(z_full, z_w, tau))
            kl_fs = float(kl_teacher_student(z_full, z_sent, tau))
            phi = local_fidelity(info["f"], f_full, f_sent)
            psi = knowledge_fidelity(kl_fs, kl_fw)
            if p.reward == "v4":  # T_exp: the client's mean work so far at this round's rates
                work = work_vector(broadcast.nbytes, ctx.flops_per_sample * seen, t_select, upload.nbytes)
                st["W_sum"] = st["W_sum"] + work
                st["W_count"] += 1
                t_exp = expected_seconds(st["W_sum"], st["W_count"], profile_costs(pf), pf.latency_s)
                parts = reward_v4(phi, psi, T, t_exp, p.rho_value, p.kappa, p.reward_clip)
                v4_parts["sim_Texp"] = t_exp
                pending.update(work=work, wbar=st["W_sum"] / st["W_count"])
            else:
                parts = reward_v3(phi, psi, T, t_bar, p.rho_value, p.kappa, p.reward_clip)
            parts.update(reward_df=df, reward_tbar=t_bar)
            v3_parts.update(phi=phi, psi=psi, progress_g=parts["reward_g"], reward_sent=parts["reward"],
                            probe_loss_full=f_full, kl_full_w=kl_fw, kl_full_sent=kl_fs)
            pending.update(T=T, parts=parts)
            if p.time_model == "measured":  # what the measured phase times are compared with
                pending.update(train_share=seen / (seen + FORWARD_FRACTION * forwards), latency=float(pf.latency_s))
                if "work" not in pending:
                    pending["work"] = work_vector(broadcast.nbytes, ctx.flops_per_sample * seen, t_select,
                                                  upload.nbytes)
        else:
            T = simulated_seconds(pf, train_flops, ops, upload.nbytes)
            pending["T"] = T
            if p.reward == "v2":
                st["T_sum"] += T
                st["T_count"] += 1
                t_bar = st["T_sum"] / st["T_count"]
                pending.update(df=df, tbar=t_bar)
            else:
                if len(st["T_warm"]) < p.tbar_window:
                    st["T_warm"].append(T)
                t_bar = float(np.mean(st["T_warm"]))
                pending.update(f=info["f"], D=info["D"])
        v3_parts.update(sim_T_select=t_select,
                        sim_T_measure=float(clock.compute_seconds(measure_flops, pf.gflops)))
        st["pending"] = pending
        st["undo"] = undo

        metrics: dict[str, Any] = {
            "train_loss": loss,
            "arm": arm,
            "arm_label": label,
            "arm_k": math.nan if arm_k is None else float(arm_k),
            "arm_reason": reason,
            "k": c.k,
            "residual_norm": res_norm,
            "epsilon": float(eps),
            "probe_loss": info["f"],
            "probe_loss_sent": f_sent,
            "df_sent": df,
            "probe_kl": info["D"],
            "sim_T": T,
            "sim_Tbar": t_bar,
            "restored_round": info["restored_round"],
            **v3_parts,
            **v4_parts,
        }
        metrics.update(policy_values(policy, p.arms))
        metrics.update(info["closed"])
        return ClientResult(
            client_id=ctx.client_id,
            arch=ctx.arch,
            upload=upload,
            num_samples=len(ctx.train_y) - (len(self.probe_indices(ctx)) if v3 else 0),  # v3: probe held out
            train_flops=train_flops,
            compress_ops=ops,
            metrics=metrics,
        )

    def public_probe(self, ctx: ClientContext, broadcast: Payload) -> torch.Tensor:
        """v3: the public probe inputs (the first ``psi_probe_size`` of the server's probe set).
        Clients may hold them (the public set is public by definition): they ride in the
        broadcast's meta for the simulator's convenience and are not counted as downloaded."""
        x = broadcast.meta.get("public_probe")
        if x is None:
            raise ValueError("reward v3 needs the public probe in the broadcast (meta['public_probe'])")
        return x[: self.params.psi_probe_size].to(ctx.train_x.device)

    def train_rows(self, ctx: ClientContext) -> torch.Tensor | None:
        """v3: every row but the local probe's, in order (batched training draws over these too)."""
        if self.params.reward not in FIDELITY_REWARDS:
            return None
        keep = torch.ones(len(ctx.train_y), dtype=torch.bool, device=ctx.train_x.device)
        keep[self.probe_indices(ctx)] = False
        return keep.nonzero().squeeze(1)

    def training_context(self, ctx: ClientContext) -> ClientContext:
        """v3: ``ctx`` with the local probe held out of the training data (:meth:`train_rows`)."""
        rows = self.train_rows(ctx)
        if rows is None:
            return ctx
        return dataclasses.replace(ctx, train_x=ctx.train_x[rows], train_y=ctx.train_y[rows])

    def on_dropped(self, state: dict[str, Any], round: int) -> None:
        """The upload of ``round`` never arrived: no update of this client was aggregated.

        * residual: what was sent goes back (``e = a``; see the parent);
        * pending reward: v2, v3 - marked lost: it closes at the next participation as ``−clip``
          (its time was spent for nothing) and is fed to the policy; v1 - discarded, never
          computed nor fed (its Δf and ΔD would measure the other clients' updates);
        * undo: dropped - the server never saw this upload, so a rollback of ``round`` must not
          reset this client's residual to before it (that would lose the restored mass);
        * policy: kept as it is after the choice (unlike a rollback, the choice is not undone);
          the round's T stays in T̄ (it measures the hardware).
        """
        super().on_dropped(state, round)
        pending = state.get("pending")
        if pending is not None and pending["round"] == round:
            if self.params.reward != "v1":
                pending["lost"] = True
            else:
                del state["pending"]
                policy = state.get("policy")
                if isinstance(policy, Exp3):  # the probability of a choice whose reward never comes
                    policy.pending_p.pop(pending["arm"], None)
        undo = state.get("undo")
        if undo is not None and undo["round"] == round:
            del state["undo"]


# ------------------------------------------------------------------------------------------------
# server
# ------------------------------------------------------------------------------------------------
DD_ENTRY_BYTES = 12  # one (int32 client id, int32 round, float32 ΔD) entry of the broadcast


class AscendServer(Server):
    """One global model per architecture, distillation on the public split, rollback guard,
    and (reward v2) the alignment term of every arrived upload."""

    params: AscendParams
    checkpoint_fields = ("teacher_probe", "teacher_distilled", "d_history", "dd_entries", "rolled_back",
                         "forced_until", "ref_loss", "consecutive_rollbacks", "rolled_back_updates")

    def __init__(
        self,
        params: AscendParams,
        models: dict[str, torch.nn.Module],
        seed: int,
        context: ServerContext | None = None,
    ):
        super().__init__(params, models, seed, context)
        ctx = self.context
        if ctx.public_x is None or len(ctx.public_x) == 0:
            raise ValueError(
                "ASCEND needs a server-side public split for distillation: set partition.public_fraction > 0 "
                "(the spec's default is 0.1)"
            )
        self.public_x = ctx.public_x.float()
        n = len(self.public_x)
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, PUBLIC_PROBE_SALT]).generate_state(1)[0]))
        self.probe_idx = torch.randperm(n, generator=g)[: min(params.public_probe_size, n)].sort().values
        self.probe_x = self.public_x[self.probe_idx]
        self.probe_y = None if ctx.public_y is None else ctx.public_y[self.probe_idx].long()
        if params.gamma is not None and params.rollback_loss == "ce" and self.probe_y is None:
            raise ValueError("rollback_loss='ce' needs public labels (ServerContext.public_y); use 'kl'")
        self.arch_order = sorted(models)
        self.batch = ctx.eval_batch_size
        self.teacher_probe: torch.Tensor | None = None  # teacher logits on the probe set
        self.teacher_distilled = False  # whether teacher_probe is a distillation's (not the initial consensus)
        self.d_history: dict[str, dict[int, float]] = {a: {} for a in models}  # v1: D by round
        self.dd_entries: dict[str, dict[int, list]] = {a: {} for a in models}  # v2: client -> [round, ΔD]
        self.rolled_back: list[int] = []
        self.rolled_back_updates: list[list[int]] = []  # asynchronous: [client, wave] of each discarded update
        self.forced_until = -1
        self.ref_loss: float | None = None
        self.consecutive_rollbacks = 0
        self._rows: list[dict[str, Any]] = []
        self._alignment: list[dict[str, Any]] = []
        self._aggregate_logits: dict[str, torch.Tensor] = {}  # build_teacher -> _distill_and_guard

    @classmethod
    def timing_payload(cls, params, shapes):
        raise TimingUnsupported(
            "each client's bandit picks its compressor (and K) from the rewards of its training, a rollback "
            "forces Top-K rounds after a probe loss rises, and the broadcast carries the clients' reward "
            "terms, so its payloads depend on training")

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """As the base class's; a checkpoint written before asynchronous ASCEND has no
        ``rolled_back_updates`` (it had no asynchronous rollbacks): an empty list."""
        if "rolled_back_updates" not in state["fields"]:
            state = {**state, "fields": {**state["fields"], "rolled_back_updates": []}}
        super().restore_checkpoint_state(state)

    # ------------------------------------------------------------------ probe quantities
    def ensemble_probe_logits(self) -> torch.Tensor:
        return torch.stack([logits_of(self.models[a], self.probe_x, self.batch) for a in self.arch_order]).mean(0)

    def teacher_on_probe(self) -> torch.Tensor:
        if self.teacher_probe is None:  # before the first distillation: the global models' consensus
            self.teacher_probe = self.ensemble_probe_logits()
        return self.teacher_probe

    def probe_kl(self, arch: str, teacher: torch.Tensor | None = None, model: torch.nn.Module | None = None,
                 logits: torch.Tensor | None = None) -> float:
        """``D = KL(teacher ‖ w)`` on the public probe set (``w``: the architecture's model;
        ``logits``: its logits on the probe set, when the caller has them)."""
        t = self.teacher_on_probe() if teacher is None else teacher
        s = logits if logits is not None else logits_of(
            self.models[arch] if model is None else model, self.probe_x, self.batch)
        return float(kl_teacher_student(t, s, self.params.temperature))

    def global_probe_loss(self, logits: dict[str, torch.Tensor] | None = None) -> float:
        """The rollback's global loss: mean over architectures (equal weight) of the cross-entropy
        with the public labels (``ce``) or of ``KL(teacher ‖ w_P)`` (``kl``) on the probe set.
        ``logits``: the present models' logits on the probe set by architecture, if already known."""
        vals = []
        for a in self.arch_order:
            z = logits[a] if logits is not None else logits_of(self.models[a], self.probe_x, self.batch)
            if self.params.rollback_loss == "ce":
                vals.append(float(F.cross_entropy(z, self.probe_y)))
            else:
                vals.append(self.probe_kl(a, logits=z))
        return float(np.mean(vals))

    def probe_is_public(self) -> bool:
        """Whether the probe set is the whole public split in its order (a public split of at
        most ``public_probe_size`` samples): logits on one are then logits on the other."""
        return len(self.probe_idx) == len(self.public_x)

    # ------------------------------------------------------------------ broadcast
    def broadcast(self, round: int) -> Broadcast:
        p = self.params
        out: Broadcast = {}
        forced_now = round <= self.forced_until
        for arch, model in self.models.items():
            payload = state_payload(flat_state(model))
            payload.meta = {
                "round": round,
                "rolled_back": list(self.rolled_back),
                "rolled_back_updates": [list(u) for u in self.rolled_back_updates],
                "forced": forced_now,
                "forced_until": self.forced_until,
            }
            control = len(self.rolled_back) + 2 * len(self.rolled_back_updates) + 2
            if p.reward == "v1":
                hist = self.d_history[arch]
                hist[round] = self.probe_kl(arch)
                for old in sorted(hist)[: max(0, len(hist) - p.d_history)]:
                    del hist[old]
                payload.meta["probe_kl"] = dict(hist)
                control += 2 * len(hist)
            elif p.reward in FIDELITY_REWARDS:  # the clients' public probe (not counted: clients may hold it)
                payload.meta["public_probe"] = self.probe_x
            else:
                entries = self.dd_entries[arch]
                for cid in [c for c, (r, _) in entries.items() if r < round - p.d_history]:
                    del entries[cid]
                payload.meta["dd"] = {cid: list(v) for cid, v in entries.items()}
                payload.nbytes += DD_ENTRY_BYTES * len(entries)
            payload.nbytes += CONTROL_VALUE_BYTES * control
            out[arch] = payload
        return out

    # ------------------------------------------------------------------ aggregation
    def _sfx(self, arch: str) -> str:
        return f"_{arch}" if arch else ""

    def _empty_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rollback": 0, "rollback_capped": 0, "probe_loss": math.nan, "probe_loss_ref": math.nan,
            "forced_until": self.forced_until, "num_aggregated": 0, "update_norm": 0.0,
            "dd_mean": math.nan, "dd_min": math.nan, "dd_max": math.nan,
        }
        for a in self.arch_order:
            for key in ("distill_loss", "distill_kl0", "distill_kl"):
                out[f"{key}{self._sfx(a)}"] = math.nan
        return out

    def alignment_terms(self, results: list[ClientResult], bases: dict[str, torch.Tensor],
                        deltas: list[torch.Tensor], teacher: torch.Tensor | None) -> list[tuple[float, float, float]]:
        """``(D(w_P^t), D(w_P^t + Δ̂_n), ΔD_n)`` of every upload against ``teacher`` (the previous
        round's teacher on the probe set); NaNs when there is none yet (ρ_eff = 0)."""
        if teacher is None:
            return [(math.nan, math.nan, math.nan)] * len(results)
        d0 = {a: self.probe_kl(a, teacher) for a in bases}
        scratch: dict[str, torch.nn.Module] = {}
        out = []
        for r, delta in zip(results, deltas):
            if r.arch not in scratch:
                scratch[r.arch] = copy.deepcopy(self.models[r.arch])
            m = scratch[r.arch]
            load_flat_params(m, bases[r.arch] + delta)
            d1 = self.probe_kl(r.arch, teacher, model=m)
            out.append((d0[r.arch], d1, relative_decrease(d0[r.arch], d1)))
        return out

    def build_teacher(self, results: list[ClientResult], bases: dict[str, torch.Tensor] | list[torch.Tensor],
                      deltas: list[torch.Tensor] | None = None, weights: list[float] | None = None) -> torch.Tensor:
        """Teacher logits on the whole public split. ``bases``: the parameters each upload's delta
        applies to, by architecture (a round) or per upload (an asynchronous step: its base
        version's); ``weights``: per upload (None: equal; asynchronous: the staleness weights)."""
        x, b = self.public_x, self.batch
        if self.params.teacher == "aggregates":
            zs = [logits_of(self.models[a], x, b) for a in self.arch_order]
            # kept for distill_kl0, the same forwards when the probe set is the public split
            self._aggregate_logits = dict(zip(self.arch_order, zs)) if self.probe_is_public() else {}
            return torch.stack(zs).mean(0)
        if deltas is None:
            deltas = [decode_upload(r.upload).dense() for r in results]
        acc, count, scratch = None, 0, {}
        for i, (r, delta) in enumerate(zip(results, deltas)):  # each client's reconstructed model w_P^t + delta_hat_n
            if r.arch not in scratch:
                scratch[r.arch] = copy.deepcopy(self.models[r.arch])
            m = scratch[r.arch]
            load_flat_params(m, (bases[i] if isinstance(bases, list) else bases[r.arch]) + delta)
            z = logits_of(m, x, b)
            if weights is not None:
                z = z * float(weights[i])
            acc = z if acc is None else acc + z
            count += 1 if weights is None else float(weights[i])
        return acc / count

    def distill(self, arch: str, teacher: torch.Tensor, round: int) -> float:
        """``distill_steps`` Adam steps on ``KL(teacher ‖ student)`` (fresh optimizer each round);
        returns the mean batch KL over the steps (NaN with 0 steps)."""
        p = self.params
        n = len(self.public_x)
        if p.distill_steps == 0 or n == 0:
            return math.nan
        model = self.models[arch]
        seed = int(np.random.SeedSequence([self.seed, round, self.arch_order.index(arch), DISTILL_SALT])
                   .generate_state(1)[0])
        idx = torch.randint(n, (p.distill_steps, min(p.distill_batch, n)),
                            generator=torch.Generator().manual_seed(seed))
        t_logp = F.log_softmax(teacher / p.temperature, dim=1)
        opt = Adam(model.parameters(), lr=p.distill_lr)
        model.train()
        losses = torch.empty(p.distill_steps)
        for step in range(p.distill_steps):
            bi = idx[step]
            s_logp = F.log_softmax(model(self.public_x[bi]) / p.temperature, dim=1)
            loss = F.kl_div(s_logp, t_logp[bi], log_target=True, reduction="batchmean")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[step] = loss.detach()
        model.eval()
        return float(losses.mean())

    def _distill_and_guard(self, round: int, teacher: torch.Tensor, snapshot: dict[str, torch.Tensor],
                           previous: tuple[torch.Tensor | None, bool], num_results: int,
                           out: dict[str, Any]) -> tuple[bool, bool, float]:
        """Steps 3 and 4 of a server step (round or asynchronous step ``round``): distil every
        architecture towards ``teacher``, then the rollback guard (a spike restores ``snapshot``
        and ``previous``, the teacher before the step, and forces Top-K). Returns
        ``(spike, capped, loss)``; the caller records whose uploads a spike discarded."""
        p = self.params
        prev_teacher, prev_distilled = previous
        teacher_probe = teacher[self.probe_idx]
        before, self._aggregate_logits = self._aggregate_logits, {}  # build_teacher's, of these models
        after: dict[str, torch.Tensor] = {}  # the distilled models' probe logits, for the guard too
        for arch in self.arch_order:
            sfx = self._sfx(arch)
            out[f"distill_kl0{sfx}"] = self.probe_kl(arch, teacher_probe, logits=before.get(arch))
            out[f"distill_loss{sfx}"] = self.distill(arch, teacher, round)
            after[arch] = logits_of(self.models[arch], self.probe_x, self.batch)
            out[f"distill_kl{sfx}"] = self.probe_kl(arch, teacher_probe, logits=after[arch])
        self.teacher_probe, self.teacher_distilled = teacher_probe, True

        # 4. rollback guard
        loss = self.global_probe_loss(after)
        before = self.ref_loss
        threshold = (1.0 + p.gamma) * before if p.gamma is not None else math.inf
        spike = p.gamma is not None and math.isfinite(before) and not (loss <= threshold)  # NaN is a spike
        capped = (
            spike and math.isfinite(loss) and p.max_consecutive_rollbacks is not None
            and self.consecutive_rollbacks >= p.max_consecutive_rollbacks
        )
        row = {"round": round, "loss_before": before, "loss_after": loss, "threshold": threshold,
               "forced_until": self.forced_until, "num_discarded": 0, "loss_kind": p.rollback_loss,
               "consecutive": self.consecutive_rollbacks}
        if capped:  # too many in a row: the guard would freeze training; accept this round
            spike = False
            self._rows.append({**row, "action": "accepted",
                               "reason": f"max_consecutive_rollbacks={p.max_consecutive_rollbacks} reached: "
                                         "spike accepted as the new reference"})
        if spike:
            self.consecutive_rollbacks += 1
            for a, m in self.models.items():
                load_flat_state(m, snapshot[a])
            self.teacher_probe, self.teacher_distilled = prev_teacher, prev_distilled
            self.forced_until = round + p.forced_rounds
            reason = "loss not finite" if not math.isfinite(loss) else f"loss > (1+gamma) x reference, gamma={p.gamma}"
            self._rows.append({**row, "forced_until": self.forced_until, "num_discarded": num_results,
                               "action": "rolled_back", "reason": reason})
        else:
            self.ref_loss = loss
            self.consecutive_rollbacks = 0
        return spike, capped, loss

    def aggregate(self, round: int, results: list[ClientResult]) -> dict[str, Any]:
        p = self.params
        if self.ref_loss is None:
            self.ref_loss = self.global_probe_loss()  # loss of the initial models
        out = self._empty_metrics()
        out["probe_loss_ref"] = self.ref_loss
        if not results:
            out["probe_loss"] = self.ref_loss
            return out
        snapshot = {a: flat_state(m).clone() for a, m in self.models.items()}
        prev_teacher, prev_distilled = self.teacher_probe, self.teacher_distilled
        bases = {r.arch: flat_params(self.models[r.arch]) for r in results if r.arch in self.models}
        deltas = [decode_upload(r.upload).dense() for r in results]

        # 0. (v2) the alignment term of every upload, against the previous round's teacher
        align = []
        if p.reward == "v2":
            align = self.alignment_terms(results, bases, deltas, prev_teacher if prev_distilled else None)

        # 1. per-architecture aggregation of the reconstructed deltas (sample-count weights)
        updates = apply_compressed_updates(self.models, results, p.buffers)
        sq = sum(float(torch.sum(u.double() ** 2)) for u in updates.values())

        # 2. teacher, 3. distillation of every architecture, 4. rollback guard
        teacher = self.build_teacher(results, bases, deltas)
        spike, capped, loss = self._distill_and_guard(round, teacher, snapshot, (prev_teacher, prev_distilled),
                                                      len(results), out)
        if spike:
            self.rolled_back.append(round)

        # 5. (v2) publish each upload's ΔD for its client's next broadcast (not for a discarded round)
        if align:
            for r, (d0, d1, dd) in zip(results, align):
                if not spike:
                    self.dd_entries[r.arch][int(r.client_id)] = [round, dd]
                self._alignment.append({"round": round, "client_id": int(r.client_id), "arch": r.arch,
                                        "arm": r.upload.meta.get("compressor", ""), "d_before": d0,
                                        "d_after": d1, "dd": dd, "rolled_back": bool(spike)})
            dds = np.array([a[2] for a in align], dtype=float)
            if np.isfinite(dds).any():
                out.update(dd_mean=float(np.nanmean(dds)), dd_min=float(np.nanmin(dds)), dd_max=float(np.nanmax(dds)))
        out.update(
            rollback=int(spike), rollback_capped=int(capped), probe_loss=loss, forced_until=self.forced_until,
            num_aggregated=len(results), update_norm=sq**0.5,
        )
        return out

    def async_step(self, step: int, updates: list, rule) -> dict[str, Any]:
        """One asynchronous step (docs/async.md, "ASCEND"): the FedBuff (FedAsync) step of the
        decoded compressed updates, staleness-weighted (:func:`algorithms.asynchronous.apply_states`,
        each delta against its base version, applied to the current models); the teacher on the
        public split (``aggregates``: the stepped models; ``clients``: each update's reconstructed
        model, its base version plus its delta, weighted by ``s(tau)``); distillation; the rollback
        guard, which discards the step's updates by (client, wave). Rewards v3/v4 only (v1/v2 need
        per-round figures: refused by the config)."""
        if self.params.reward not in FIDELITY_REWARDS:
            raise ValueError(f"algorithm.reward = {self.params.reward!r} cannot run asynchronously; "
                             f"allowed: {', '.join(FIDELITY_REWARDS)}")
        if self.ref_loss is None:
            self.ref_loss = self.global_probe_loss()  # loss of the initial models
        out = self._empty_metrics()
        out["probe_loss_ref"] = self.ref_loss
        snapshot = {a: flat_state(m).clone() for a, m in self.models.items()}
        previous = (self.teacher_probe, self.teacher_distilled)
        before = {a: flat_params(m) for a, m in self.models.items()}
        apply_states(self.models, updates, rule)
        sq = sum(float(torch.sum((flat_params(m) - before[a]).double() ** 2)) for a, m in self.models.items())
        results = [u.result for u in updates]
        bases = [torch.from_numpy(u.base[: len(before[u.result.arch])]).float() for u in updates]
        teacher = self.build_teacher(results, bases, weights=[u.weight for u in updates])
        spike, capped, loss = self._distill_and_guard(step, teacher, snapshot, previous, len(updates), out)
        if spike:
            self.rolled_back_updates.extend([int(u.result.client_id), int(u.wave)] for u in updates)
        out.update(rollback=int(spike), rollback_capped=int(capped), probe_loss=loss, forced_until=self.forced_until,
                   num_aggregated=len(updates), update_norm=sq**0.5)
        return out

    def drain_tables(self) -> dict[str, list[dict[str, Any]]]:
        out = {}
        if self._rows:
            out["rollbacks"], self._rows = self._rows, []
        if self._alignment:
            out["alignment"], self._alignment = self._alignment, []
        return out


SPEC = AlgorithmSpec(
    "ascend",
    AscendParams,
    AscendClient,
    AscendServer,
    "ASCEND: per-client bandit choice of compressor in federated knowledge distillation, with rollback",
)

__all__ = [
    "SPEC",
    "DEFAULT_ARMS",
    "AscendClient",
    "AscendParams",
    "AscendServer",
    "ascend_reward_v1",
    "kl_teacher_student",
    "policy_values",
    "relative_decrease",
    "knowledge_fidelity",
    "local_fidelity",
    "reward_v2",
    "reward_v3",
    "reward_v4",
    "selection_seconds",
    "simulated_seconds",
    "time_factor",
]
