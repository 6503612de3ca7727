"""What-if study: the same experiment and seed, with the whole fleet on 500 Mbps versus half of
it moved to 5 Mbps (the fleets are in ``studies/whatif_bandwidth.yaml``). Runs both fleets in
parallel with ``hetsim whatif`` (a Ray Tune sweep with a ``fleet`` column), prints simulated time
per round, time-to-accuracy and accuracy for both, and writes ``compare.html`` in the folder.

    .venv/bin/python studies/whatif_bandwidth.py [--rounds 20] [--out whatif_out/whatif_bandwidth] [--set KEY=VALUE ...]
    hetsim whatif studies/whatif_bandwidth.yaml          # the same, from the command line
    .venv/bin/python studies/whatif_bandwidth.py --smoke  # 2 rounds of 4 clients, a trial at a time: the pipeline

Only the network profile differs between the two runs: the data, the selection, the training
and therefore the accuracies are identical; what changes is the simulated time.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hetsim.compare import time_to_target
from hetsim.whatif import report_whatif
from sweeps import whatif

SPEC = Path(__file__).with_suffix(".yaml")
SMOKE = ["rounds=2", "clients.num_clients=4"]  # --smoke: the pipeline in seconds once Ray is up


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=None, help="default: the YAML's (20)")
    p.add_argument("--out", default=None, help="results folder (default: whatif_out/whatif_bandwidth)")
    p.add_argument("--target", type=float, default=None,
                   help="accuracy for time-to-accuracy (default: the YAML's, 0.8)")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--smoke", action="store_true",
                   help="2 rounds of 4 clients, one trial at a time (--rounds and --set still apply)")
    args = p.parse_args(argv)

    spec, fleets, spec_dir = whatif.load_whatif_file(SPEC)
    target = args.target if args.target is not None else spec.target
    overrides = [*spec.overrides, *(SMOKE if args.smoke else []), *([f"rounds={args.rounds}"] if args.rounds else []),
                 *args.overrides]
    sweep = whatif.run_whatif(whatif.base_experiment(spec.base, spec_dir), fleets, name=spec.name,
                              overrides=overrides, storage=args.out or spec.storage,
                              # --smoke: trials of a second; one trial process runs both (each costs seconds to start)
                              max_concurrent_trials=1 if args.smoke else spec.max_concurrent_trials)
    report_whatif(sweep, target=target)

    rows = []
    for trial in sweep.trials.itertuples():
        run = sweep.run(trial.trial_id)
        r, c = run.rounds, run.clients
        rows.append({
            "scenario": trial.fleet,
            "sim_s_per_round": r["sim_round_s"].mean(),
            "sim_total_s": r["sim_time_s"].iloc[-1],
            "mean_client_upload_s": c["sim_upload_s"].mean(),
            f"time_to_{target:.0%}_s": time_to_target(r, "global_acc", target)[0],
            "final_global_acc": r["global_acc"].iloc[-1],
        })
    table = pd.DataFrame(rows).set_index("scenario")
    fast, slow = table.loc["all_500mbps"], table.loc["half_5mbps"]
    print()
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"\nhalf the fleet on 5 Mbps: {slow.sim_s_per_round / fast.sim_s_per_round:.1f}x the simulated "
          f"time per round (+{slow.sim_s_per_round - fast.sim_s_per_round:.2f} s)")


if __name__ == "__main__":
    main()
