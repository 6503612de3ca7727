"""How many local steps each client does: the mechanics around the configured work policy
(``train.work``, :mod:`algorithms.work`).

The loops ask :meth:`LocalWork.steps` for the clients about to train, once their start and the
bytes of their download are known (a synchronous round: after its broadcast; an asynchronous wave:
at its dispatch), and hand the counts to the client hosts, which train exactly those steps
(``ctx.train.local_steps``). The policy's view carries the clock's own arithmetic
(:meth:`~algorithms.work.WorkView.finish_s`: :func:`~hardware_profiles.clock.client_times` and the
fleet's conditions over time, on the method's wire format from :meth:`Server.timing_payload`), so
a ``deadline`` policy never makes a client miss the deadline by training: a full run and a
``clock.mode: timing_only`` run (which asks the same) give every client the same steps and FLOPs.

With the ``fixed`` policy nothing is passed: the run is the run without ``train.work``.
"""
from __future__ import annotations

import numpy as np

from algorithms.base import FLOAT32_BYTES, ArchShape, TimingPayload, TimingUnsupported
from algorithms.plugins import WORK_POLICIES
from algorithms.training import flat_buffers, local_samples, num_params
from algorithms.work import WorkView, checked_steps, configured_steps
from engine.config.schema import ExperimentConfig
from engine.errors import PluginError
from engine.models.arch import arch_flops
from hardware_profiles.clock import client_times
from hardware_profiles.errors import user_frames
from hardware_profiles.round_clock import phase_timeline

STEPS_COLUMN = "local_steps"  # clients.parquet: the steps each client did (runs with a work policy)


class LocalWork:
    """The configured work policy with what it sees: the fleet's clock, the clients' training rows,
    each architecture's FLOPs per sample and the method's wire format.

    ``flops_per_sample``: per architecture code (``client_arch``); ``payload``: the method's
    :class:`~algorithms.base.TimingPayload` (None: sized from ``shapes`` as a dense upload).
    """

    def __init__(self, cfg: ExperimentConfig, clock, n_train: np.ndarray, arch_names: list[str],
                 client_arch: np.ndarray, flops_per_sample: np.ndarray, payload: TimingPayload | None):
        spec = cfg.train.work
        self.cfg, self.params, self.name = cfg, spec, spec.policy
        self.active = spec.policy != "fixed"
        self.clock, self.n_train = clock, np.asarray(n_train, dtype=np.int64)
        self.arch_names, self.client_arch = arch_names, np.asarray(client_arch)
        self.flops_per_sample = np.asarray(flops_per_sample, dtype=np.float64)
        self.payload = payload
        t = cfg.train
        self.batch_size, self.epochs, self.local_steps = t.batch_size, t.local_epochs, t.local_steps

    @staticmethod
    def payload_of(server_cls, params, shapes: dict) -> TimingPayload:
        """The method's wire format (:meth:`Server.timing_payload`); for a method whose upload
        depends on training, a dense float32 upload of the whole state and no compression: an
        upper bound of what most methods send (docs/toolbox.md)."""
        try:
            return server_cls.timing_payload(params, shapes)
        except TimingUnsupported:
            full = {arch: FLOAT32_BYTES * shape.state for arch, shape in shapes.items()}
            return TimingPayload(full, full)

    def steps(self, r: int, ids: np.ndarray, start_s: float, download: dict[str, float],
              deadline_s: float | None) -> np.ndarray | None:
        """The local steps of the clients ``ids`` starting at ``start_s`` (None: the fixed policy);
        ``download``: the bytes of each architecture's broadcast; ``deadline_s``: their deadline,
        seconds after ``start_s``, as known before they run (None: none)."""
        if not self.active:
            return None
        ids = np.asarray(ids, dtype=np.int64)
        view = self.view(r, ids, start_s, download, deadline_s)
        try:
            chosen = WORK_POLICIES.get(self.name)(view)
        except Exception as err:  # noqa: BLE001 - the user's policy: said with its name and round
            frames = user_frames(err)
            raise PluginError(f"work policy {self.name!r} failed in round {r}: {type(err).__name__}: {err}"
                              + (f"\n{frames}" if frames else "")) from err
        try:
            return checked_steps(self.name, chosen, view)
        except ValueError as err:
            raise PluginError(str(err)) from None

    @classmethod
    def build(cls, cfg: ExperimentConfig, clock, data, arch_names: list[str], client_arch: np.ndarray,
              models: dict, server_cls) -> "LocalWork":
        """The run's work policy; the FLOP counts and the wire format only when a policy is active."""
        fps, payload = np.zeros(len(arch_names)), None
        if cfg.train.work.policy != "fixed":
            fps = np.array([arch_flops(cfg, a, data.input_shape, data.num_classes) for a in arch_names])
            shapes = {a: ArchShape(num_params(m), int(flat_buffers(m).numel())) for a, m in models.items()}
            payload = cls.payload_of(server_cls, cfg.algorithm, shapes)
        return cls(cfg, clock, data.client_num_train(), arch_names, client_arch, fps, payload)

    def view(self, r: int, ids: np.ndarray, start_s: float, download: dict[str, float],
             deadline_s: float | None) -> WorkView:
        rows = self.n_train[ids]
        code = self.client_arch[ids]
        names = self.arch_names
        down = np.array([float(download.get(a, 0.0)) for a in names], dtype=np.float64)[code]
        up, ops = (np.array(x, dtype=np.float64) for x in zip(*(self.payload.upload_bytes(a) for a in names)))
        clock = self.clock

        def finish(steps: np.ndarray) -> np.ndarray:
            samples = self.payload.train_samples(rows, lambda n: local_samples(n, self.batch_size, 1, steps))
            sent = {"bytes_down": down, "bytes_up": up[code], "train_flops": self.flops_per_sample[code] * samples,
                    "compress_ops": ops[code]}
            times = client_times(clock.profiles, ids, sent["bytes_down"], sent["bytes_up"], sent["train_flops"],
                                 sent["compress_ops"])
            phase_timeline(clock.conditions, ids, start_s, times, sent, None)  # conditions: times in place
            return times["total_s"]

        return WorkView(round=r, ids=ids, configured=configured_steps(rows, self.batch_size, self.epochs,
                                                                      self.local_steps),
                        train_samples=rows, batch_size=self.batch_size, gflops=clock.profiles.gflops[ids],
                        profiles=clock.profiles, start_s=float(start_s), deadline_s=deadline_s, params=self.params,
                        _finish=finish)

    def samples(self, ids: np.ndarray, steps: np.ndarray | None, local_samples_fn) -> np.ndarray:
        """Samples each of ``ids`` trains on (the method's count, :meth:`TimingPayload.train_samples`)
        with ``steps`` (None: the configured work, ``local_samples_fn``)."""
        rows = self.n_train[ids]
        if steps is None:
            return self.payload.train_samples(rows, local_samples_fn)
        return self.payload.train_samples(rows, lambda n: local_samples(n, self.batch_size, 1, steps))

    def done(self, ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The steps ``ids`` do when given ``steps``: a client without training rows does none."""
        return np.where(self.n_train[ids] > 0, steps, 0)


def with_steps(now: dict | None, ids: np.ndarray, steps: np.ndarray | None, key: str) -> dict | None:
    """The executor's per-client extras ``now`` with each client's steps under ``key``."""
    if steps is None:
        return now
    now = now or {}
    for c, s in zip(np.asarray(ids).tolist(), steps.tolist()):
        now.setdefault(c, {})[key] = int(s)
    return now
