"""The federated data of an experiment: its dataset loaded (cached) and partitioned as configured."""
from __future__ import annotations

from engine.config.schema import ExperimentConfig
from engine.data.datasets import load_dataset_cached
from engine.data.partition import FederatedData, build_federated_data


def build_data(cfg: ExperimentConfig) -> FederatedData:
    ds_cfg, p = cfg.dataset, cfg.partition
    params = dict(ds_cfg.params)
    if ds_cfg.name == "synthetic":
        params.setdefault("num_clients", cfg.clients.num_clients)
    ds = load_dataset_cached(ds_cfg.name, root=ds_cfg.root, download=ds_cfg.download, seed=cfg.seed, **params)
    return build_federated_data(
        ds,
        num_clients=cfg.clients.num_clients,
        scheme=p.scheme,
        seed=cfg.seed,
        alpha=p.alpha,
        shards_per_client=p.shards_per_client,
        min_samples=p.min_samples,
        test_fraction=p.test_fraction,
        global_test_fraction=p.global_test_fraction,
        public_fraction=p.public_fraction,
    )
