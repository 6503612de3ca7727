"""The Ray cluster of a sweep: does a trial fit it, and where do the trials' results go.

Storage is Tune's: ``RunConfig(storage_path, storage_filesystem)`` with the pyarrow filesystem
of :func:`engine.storage.locations.open_storage`. A local path on a cluster that the driver joined gets a
:func:`engine.ray.node_disk.node_disk_filesystem`: nodes that do not share the folder send their
results to this node through Ray.
"""
from __future__ import annotations

from engine.ray.cluster import joins_cluster
from engine.ray.node_disk import node_disk_filesystem, nodes_sharing
from engine.ray.pool import gpu_capacity
from engine.results import Storage
from sweeps.callbacks import say
from sweeps.spec import ResolvedSweep, SweepSpecError


def alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def check_fits(ray, resolved: ResolvedSweep) -> None:
    """A trial that cannot fit the cluster would wait forever in Tune: refuse it up front.

    Each bundle of a trial's placement group must fit on one node (the in-process executor's
    trial is a single bundle), and all of them on the cluster."""
    from sweeps.trainable import trial_resources  # torch (the Ray executor): not when runner is imported

    specs = trial_resources(resolved).bundles
    bundles = [b.get("CPU", 0.0) for b in specs]
    nodes = alive_nodes(ray)
    node_cpus = [n["Resources"].get("CPU", 0.0) for n in nodes] or [ray.cluster_resources().get("CPU", 0.0)]
    largest, total = max(node_cpus), sum(node_cpus)
    hint = ("lower resources_per_trial.cpus (or executor.num_actors x executor.cpus_per_actor of "
            "the base experiment)")
    if max(bundles) > largest + 1e-9:
        raise SweepSpecError(
            f"invalid sweep spec:\n  resources_per_trial: one trial needs {max(bundles):g} CPUs on "
            f"one node but the largest node of the Ray cluster has {largest:g} "
            f"({len(node_cpus)} node(s), {total:g} CPUs in all); {hint}")
    if sum(bundles) > total + 1e-9:
        raise SweepSpecError(
            f"invalid sweep spec:\n  resources_per_trial: one trial needs {sum(bundles):g} CPUs but "
            f"the Ray cluster has {total:g}; {hint}")
    _check_gpus_fit(ray, specs)


def _check_gpus_fit(ray, bundles: list[dict]) -> None:
    """GPUs as for CPUs: the trial's total, and each bundle's share from one node."""
    need = sum(b.get("GPU", 0.0) for b in bundles)
    if need <= 0:
        return
    have = ray.cluster_resources().get("GPU", 0.0)
    node_gpus = [n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"]]
    shares = [b["GPU"] for b in bundles if b.get("GPU", 0.0) > 0]
    fits = need <= have + 1e-9 and all(
        gpu_capacity(g, have, node_gpus) >= shares.count(g) for g in set(shares))
    if not fits:
        raise SweepSpecError(
            f"invalid sweep spec:\n  resources_per_trial: one trial needs {need:g} GPUs (bundles "
            f"{shares}) but the Ray cluster has {have:g} (per node: "
            f"{', '.join(f'{g:g}' for g in node_gpus)}); Tune would wait forever. Lower "
            "resources_per_trial.gpus (or executor.num_actors x executor.gpus_per_actor of the base "
            "experiment)")


def tune_storage(ray, resolved: ResolvedSweep, store: Storage | None = None) -> Storage:
    """The sweep's storage as Tune will use it (see the module docstring)."""
    store = store or resolved.open_storage()
    if store.is_remote or not joins_cluster(resolved.spec.ray.address):
        return store  # one node (a sweep's folder resumed with --address local too)
    fs = node_disk_filesystem(store.path)
    seen = nodes_sharing(store.path)
    private = [name for name, shared in seen.items() if not shared]
    if private:
        say(f"storage {store.path} is this node's local disk and {len(private)} of {len(seen)} "
            f"node(s) do not see it ({', '.join(private)}): their trials send their results here "
            "through Ray. For large sweeps use a shared filesystem or an s3:// URI.")
    return Storage(fs, store.path, store.uri)
