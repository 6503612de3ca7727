"""ASCEND's server half: one global model per architecture, the teacher on the public split,
distillation of every architecture towards it, the rollback guard, and (reward v2) the alignment
term of every upload; synchronous rounds and asynchronous steps.

Not here: the client half (:mod:`algorithms.ascend_client`), the aggregation of compressed updates
(:mod:`algorithms.compressed_fedavg`) and of staleness-weighted ones (:mod:`algorithms.asynchronous`).
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.ascend_reward import FIDELITY_REWARDS, kl_teacher_student, logits_of, relative_decrease
from algorithms.asynchronous import apply_states
from algorithms.base import Broadcast, ClientResult, Server, ServerContext, TimingUnsupported
from algorithms.compressed_fedavg import apply_compressed_updates, decode_upload
from algorithms.fedavg import state_payload
from algorithms.params import AscendParams
from algorithms.training import Adam, flat_params, flat_state, load_flat_params, load_flat_state

CONTROL_VALUE_BYTES = 4  # each number of the broadcast's control meta travels as 32 bits
PUBLIC_PROBE_SALT = 0x9B0B  # server's public probe subset
DISTILL_SALT = 0xD157  # distillation batches
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

