"""The federated data of an experiment: its dataset loaded (cached) and partitioned as configured,
or, for ``synthetic`` with ``lazy: true`` and ``parquet`` with ``on_disk: true``, built client by
client when a client takes part (:mod:`engine.data.ondemand`): lazy ``synthetic`` with its natural
clients only, an on-disk table with every scheme."""
from __future__ import annotations

import inspect

from engine.config.schema import ExperimentConfig
from engine.data.datasets import check_synthetic_params, load_dataset_cached, load_synthetic
from engine.data.ondemand import OnDemandFederatedData, PartitionedTableData, SyntheticSource
from engine.data.partition import PARTITION_SCHEMES, FederatedData, build_federated_data

# dataset -> the param that asks for on-demand rows
ON_DEMAND_PARAMS = {"synthetic": "lazy", "parquet": "on_disk"}
# dataset -> the partition schemes its on-demand rows take (lazy synthetic: a client's rows come from
# (seed, client id), so only its natural clients; an on-disk table: every scheme, by a row index)
ON_DEMAND_SCHEMES = {"synthetic": ("natural",), "parquet": PARTITION_SCHEMES}
LABEL_SCHEMES = [s for s in PARTITION_SCHEMES if s != "natural"]  # split a table's rows by their labels


def on_demand_requested(cfg: ExperimentConfig) -> bool:
    flag = ON_DEMAND_PARAMS.get(cfg.dataset.name)
    return bool(flag and cfg.dataset.params.get(flag))


def build_data(cfg: ExperimentConfig) -> FederatedData | OnDemandFederatedData | PartitionedTableData:
    ds_cfg, p = cfg.dataset, cfg.partition
    params = dict(ds_cfg.params)
    if ds_cfg.name == "synthetic":
        params.setdefault("num_clients", cfg.clients.num_clients)
    if on_demand_requested(cfg):
        return _build_on_demand(cfg, params)
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
        **pfllib_settings(cfg),
    )


def pfllib_settings(cfg: ExperimentConfig) -> dict:
    """``{"pfllib": partition.pfllib's fields}`` for ``scheme: pfllib``, else nothing (the other schemes'
    metadata and on-disk index keys stay as they were)."""
    p = cfg.partition
    return {"pfllib": p.pfllib.model_dump(mode="json")} if p.scheme == "pfllib" else {}


def _build_on_demand(cfg: ExperimentConfig, params: dict) -> OnDemandFederatedData | PartitionedTableData:
    name, p = cfg.dataset.name, cfg.partition
    flag = ON_DEMAND_PARAMS[name]
    if p.scheme not in ON_DEMAND_SCHEMES[name]:  # lazy synthetic: generated per natural client
        raise ValueError(f"dataset.params.{flag}: true generates each natural client's rows from (seed, client id), "
                         f"which needs partition.scheme = 'natural', not {p.scheme!r}; {p.scheme!r} splits every "
                         f"row by its label, so use {flag}: false (or an on-disk parquet table, which takes every "
                         f"scheme: {list(ON_DEMAND_SCHEMES['parquet'])})")
    params.pop(flag)
    if name == "synthetic":
        defaults = {k: v.default for k, v in inspect.signature(load_synthetic).parameters.items()
                    if k not in ("root", "download", "seed", "lazy")}
        check_synthetic_params(**{**defaults, **params})
        source = SyntheticSource(seed=cfg.seed, **{**defaults, **params})
    else:
        from engine.data.disk_table import DiskTableSource  # here: pyarrow is needed only for tables

        if p.scheme != "natural":  # the client column plays no part: the cache is in the eager pool's order
            source = DiskTableSource.open(**{**params, "client_column": None})
            return PartitionedTableData(
                source, num_clients=cfg.clients.num_clients, scheme=p.scheme, seed=cfg.seed, alpha=p.alpha,
                shards_per_client=p.shards_per_client, min_samples=p.min_samples, test_fraction=p.test_fraction,
                global_test_fraction=p.global_test_fraction, public_fraction=p.public_fraction,
                **pfllib_settings(cfg))
        if params.get("client_column") is None:
            raise ValueError("parquet: on_disk: true with partition.scheme = 'natural' needs "
                             "dataset.params.client_column (the natural clients whose rows are read when they "
                             f"take part); without one, use a label scheme: {LABEL_SCHEMES}")
        source = DiskTableSource.open(**params)
    if cfg.clients.num_clients is not None and cfg.clients.num_clients != len(source.sizes):
        raise ValueError(f"clients.num_clients = {cfg.clients.num_clients} does not match the {len(source.sizes)} "
                         f"natural clients of {source.name!r}; set num_clients to {len(source.sizes)} "
                         "for scheme='natural'")
    return OnDemandFederatedData(source, seed=cfg.seed, test_fraction=p.test_fraction,
                                 global_test_fraction=p.global_test_fraction, public_fraction=p.public_fraction)
