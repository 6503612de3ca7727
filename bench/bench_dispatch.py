"""Ray dispatch cost per client per round (Ray at scale).

    .venv/bin/python bench/bench_dispatch.py                  # 2 actors, 200 clients a round, 1M params
    .venv/bin/python bench/bench_dispatch.py --per-round 200 --rounds 10 --actors 2
    .venv/bin/python bench/bench_dispatch.py --profile         # cProfile of the loop's process too

FedAvg on ``synthetic`` with ``lazy: true`` (60 features, 10 classes, rows generated on the actors),
an ``mlp`` whose hidden widths give ~1M parameters, and local training made negligible
(``train.local_steps=1``, ``train.batch_size=1``, no evaluation). The round loop runs in this
process (a :class:`engine.loop.simulation.Simulation` with a :class:`engine.ray.executor.RayExecutor`,
as in a driver actor) and every round is timed:

* ``executor``: :meth:`RayExecutor.run_round` (broadcast ``ray.put``, the actors' calls, their
  hosts' work, the replies' transfer), minus the clients' own training (``wall_fit_s``) of the
  busiest actor; *of which Ray*: the same minus the busiest host's own
  :meth:`ClientHost.run_round` time (timed inside the actors): what Ray adds (the round's one
  broadcast ``ray.put``, the calls, each upload's copy into the object store and its transfer);
* ``whole round``: the whole :meth:`Simulation.run_round` (selection, timing model, FedAvg's
  aggregation of the uploads, the rows), minus the same training time.

Each is divided by the clients of the round: the per-client engine cost, in wall seconds, with the
actors working side by side. p50 / p90 are over the rounds after the first (warm-up). The same
rounds on the in-process executor are given for comparison (``--no-inprocess`` skips them). Most
of the cost is copies of the 4 MB model (reset, receive, upload, object store, aggregation), so the
time of one such copy on this machine, now, is printed first: on a busy machine it is several
times a quiet one's.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

HIDDEN = [1000, 940]  # 60 -> 1000 -> 940 -> 10: 1,011,350 parameters


def _config(per_round: int, rounds: int, executor: str, actors: int, num_clients: int):
    from engine.config.schema import load_config

    return load_config(None, [
        "dataset.name=synthetic", "dataset.params={lazy: true, num_features: 60, num_classes: 10}",
        "partition.scheme=natural", "model.name=mlp", f"model.params={{hidden: {HIDDEN}}}",
        f"clients.num_clients={num_clients}", f"clients.participation={per_round / num_clients}",
        "clients.profiles={availability: 1.0, dropout: 0.0}",
        "train.local_steps=1", "train.batch_size=1",
        "evaluation.personalized=false", "evaluation.global_model=false",
        f"rounds={rounds}", f"executor.kind={executor}", f"executor.num_actors={actors}",
        "executor.cpus_per_actor=1", f"ray.num_cpus={actors}",
    ])


def _time_host(actor_self) -> None:
    """Inside a client actor: time each :meth:`ClientHost.run_round` (the host's own work)."""
    host = actor_self.host
    inner = host.run_round
    actor_self.host_s = []

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        actor_self.host_s.append(time.perf_counter() - t0)
        return out

    host.run_round = timed


def _copy_ms(nbytes: int) -> float:
    """This machine's time now for one copy of a float32 array of ``nbytes`` (the unit of the costs)."""
    a = np.ones(nbytes // 4, dtype=np.float32)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        a.copy()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def measure(executor: str, per_round: int, rounds: int, actors: int, num_clients: int,
            profile: bool = False) -> dict:
    from engine.loop.simulation import Simulation
    from engine.run.body import make_executor

    cfg = _config(per_round, rounds + 1, executor, actors, num_clients)
    ex = make_executor(cfg)
    sim = Simulation(cfg, executor=ex)
    params = sum(p.numel() for m in sim.models.values() for p in m.parameters())
    sim.start()
    num_actors = getattr(ex, "num_actors", 1)
    if executor == "ray":
        import ray  # here: only the Ray case talks to actors

        ray.get([a.__ray_call__.remote(_time_host) for a in ex.actors])
    timed: list[float] = []
    inner = ex.run_round

    def run_round(*args, **kwargs):  # the executor's share of the round
        t0 = time.perf_counter()
        reply = inner(*args, **kwargs)
        timed.append(time.perf_counter() - t0)
        return reply

    ex.run_round = run_round
    rows = []
    profiler = None
    for r in range(rounds + 1):
        if profile and r == 1:
            import cProfile  # here: only with --profile

            profiler = cProfile.Profile()
            profiler.enable()
        t0 = time.perf_counter()
        rec = sim.run_round(r)
        round_s = time.perf_counter() - t0
        ran = [c for c in rec.client_rows if c.get("wall_fit_s") is not None]
        fits = np.array([c["wall_fit_s"] for c in ran])
        owner = np.array([c["client_id"] for c in ran]) % num_actors
        per_actor_fit = {int(a): float(fits[owner == a].sum()) for a in np.unique(owner)}
        rows.append({"clients": len(ran), "round_s": round_s, "executor_s": timed[-1],
                     "fit_s": max(per_actor_fit.values(), default=0.0), "per_actor_fit": per_actor_fit})
    if profiler is not None:
        import pstats  # here: only with --profile

        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    if executor == "ray":
        host_s = ray.get([a.__ray_call__.remote(lambda self: self.host_s) for a in ex.actors])
        for r, row in enumerate(rows):  # the busiest host's own time, its training excluded
            row["host_s"] = max(host_s[a][r] for a in row["per_actor_fit"])
            row["host_only_s"] = max(host_s[a][r] - f for a, f in row["per_actor_fit"].items())
    ex.close()
    steady = rows[1:]

    def pct(values, q):
        return 1e3 * float(np.percentile(values, q))

    exec_ms = [(x["executor_s"] - x["fit_s"]) / x["clients"] for x in steady]
    round_ms = [(x["round_s"] - x["fit_s"]) / x["clients"] for x in steady]
    out = {
        "executor": executor, "params": params, "clients_per_round": int(np.median([x["clients"] for x in steady])),
        "actors": num_actors, "exec_p50_ms": pct(exec_ms, 50), "exec_p90_ms": pct(exec_ms, 90),
        "round_p50_ms": pct(round_ms, 50), "round_p90_ms": pct(round_ms, 90),
        "fit_ms": 1e3 * float(np.median([sum(x["per_actor_fit"].values()) / x["clients"] for x in steady])),
        "round_s": float(np.median([x["round_s"] for x in steady])),
    }
    if executor == "ray":
        ray_ms = [(x["executor_s"] - x["host_s"]) / x["clients"] for x in steady]
        host_ms = [x["host_only_s"] / x["clients"] for x in steady]
        out.update(ray_p50_ms=pct(ray_ms, 50), ray_p90_ms=pct(ray_ms, 90), host_p50_ms=pct(host_ms, 50))
    return out


def _print(out: dict) -> None:
    print(f"{out['executor']:>9}: {out['params']:,} params, {out['clients_per_round']} clients/round, "
          f"{out['actors']} actor(s); per client, training excluded (median {out['fit_ms']:.2f} ms of CPU):",
          flush=True)
    print(f"           executor   p50 {out['exec_p50_ms']:6.2f} ms  p90 {out['exec_p90_ms']:6.2f} ms", flush=True)
    if "ray_p50_ms" in out:
        print(f"             of which Ray (executor - busiest host) p50 {out['ray_p50_ms']:6.2f} ms  "
              f"p90 {out['ray_p90_ms']:6.2f} ms; the hosts' own non-training work p50 {out['host_p50_ms']:.2f} ms",
              flush=True)
    print(f"           whole round p50 {out['round_p50_ms']:6.2f} ms  p90 {out['round_p90_ms']:6.2f} ms "
          f"(+ selection, timing model, FedAvg aggregation); median round {out['round_s']:.2f} s", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10, help="timed rounds (after one warm-up round)")
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--clients", type=int, default=10_000, help="registered clients")
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process comparison")
    ap.add_argument("--profile", action="store_true", help="cProfile the Ray rounds in this process")
    args = ap.parse_args(argv)
    from engine.ray.cluster import init_ray, shutdown_ray

    print(f"one copy of a 4 MB float32 array (the model) takes {_copy_ms(4 * 1_011_350):.2f} ms here now; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    init_ray(num_cpus=args.actors)
    try:
        _print(measure("ray", args.per_round, args.rounds, args.actors, args.clients, args.profile))
    finally:
        shutdown_ray()
    if not args.no_inprocess:
        _print(measure("inprocess", args.per_round, args.rounds, args.actors, args.clients))


if __name__ == "__main__":
    main()
