"""ASCEND's client half: the bandit's choice of a compressor each round, the local training with
its probe held out (v3, v4), the compressed upload, and the reward of the previous upload closed at
the next participation.

Not here: the reward formulas (:mod:`algorithms.ascend_reward`), the policies
(:mod:`algorithms.ascend_policy`, :mod:`algorithms.bandits`), the compressors and error feedback
(:mod:`algorithms.compressors`, :mod:`algorithms.compressed_fedavg`).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.ascend_policy import FORCED_ARM, new_policy, policy_values, rolled_back, sync_policy_params
from algorithms.ascend_reward import (
    FIDELITY_REWARDS,
    V3_COLUMNS,
    close_v1,
    close_v2,
    close_v3,
    closed_none,
    extra_closed,
    kl_teacher_student,
    knowledge_fidelity,
    local_fidelity,
    logits_of,
    relative_decrease,
    reward_v3,
    reward_v4,
    selection_seconds,
    simulated_seconds,
)
from algorithms.ascend_time import expected_seconds, work_vector
from algorithms.ascend_time import unit_costs as profile_costs
from algorithms.bandits import EpsilonGreedyEMA, Exp3, forced
from algorithms.base import ClientContext, ClientResult, Payload
from algorithms.compressed_fedavg import CompressedFedAvgClient, buffer_upload, compressed_payload
from algorithms.params import AscendParams, parse_arm
from algorithms.training import flat_params, flat_state, load_flat_params, local_sgd, same_bits
from hardware_profiles import clock

FORWARD_FRACTION = 1.0 / 3.0  # forward pass ~ 1/3 of a training step (probe-loss evaluation cost)
PROBE_SALT = 0xA5CE  # local probe set


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
        """The client's policy (:func:`algorithms.ascend_policy.new_policy`)."""
        return new_policy(self.params, rng)

    def sync_policy_params(self, policy) -> None:
        """The config's exploration settings over a restored policy's
        (:func:`algorithms.ascend_policy.sync_policy_params`)."""
        sync_policy_params(self.params, policy)

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
        closed = {**closed_none(), **extra_closed(p)}
        pending = st.pop("pending", None)
        if pending is not None:
            if p.reward == "v1":
                parts = close_v1(p, st, meta, pending, f_now, d_now)
            elif p.reward == "v2":
                parts = close_v2(p, ctx.client_id, meta, pending)
            else:
                parts = close_v3(p, st, pending, ctx.last_times)
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
        train_ctx = self.training_context(ctx)
        loss, seen = local_sgd(train_ctx, loss=self.loss_of(train_ctx))
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

