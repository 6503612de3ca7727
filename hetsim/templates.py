"""The starter configs of ``hetsim init``: each a commented YAML that validates and runs as it is
(tests/hetsim/test_newcomer.py checks that every one does). Keys: docs/config.md, docs/async.md,
docs/energy.md, docs/conditions.md.

They are also the example files in ``configs/`` (:data:`CONFIG_FILES`): one source, so a file
there is what ``hetsim init`` writes; ``python -m hetsim.templates`` rewrites them after a change
here, and tests/hetsim/test_configs.py checks that they are equal and that each runs.
"""
from __future__ import annotations

import sys
from pathlib import Path

_COMMON = """\
# A hetsim experiment: `hetsim validate -c {file}` checks it, `hetsim run -c {file}` runs it.
# Override any field without editing: --set rounds=5 --set train.lr=0.01
# What names are allowed: hetsim list datasets|models|algorithms|tiers|presets
seed: 0
rounds: 20
dataset:
  name: mnist5k              # 5,000 real MNIST images, offline (hetsim list datasets)
partition:
  scheme: dirichlet          # iid | dirichlet | shards | natural | pfllib (docs/datasets.md)
  alpha: 0.5                 # smaller: more label skew between clients
model:
  name: cnn                  # hetsim list models
train:
  local_epochs: 1
  batch_size: 16
  lr: 0.05
output:
  dir: runs                  # run folders go here
"""

_SYNC = """\
clients:
  num_clients: 20
  participation: 0.5         # share of the clients selected each round
  profiles:
    devices: {phone_mid: 0.5, laptop_cpu: 0.5}   # device tier mix (hetsim list tiers)
    network: {5mbps: 0.5, 50mbps: 0.5}           # network tier mix; or bandwidth: {low: 5, high: 500}
algorithm:
  name: fedavg               # hetsim list algorithms
clock:
  deadline_s: null           # seconds; clients slower than this are dropped from the round
                             # (or deadline: {policy: percentile, percent: 80}: docs/engine.md)
  mode: virtual              # timing_only: time the fleet without training (docs/timing.md)
"""

_ASYNC = """\
clients:
  num_clients: 20
  profiles:
    devices: {phone_low: 0.3, phone_mid: 0.4, laptop_cpu: 0.3}
    network: {4g: 0.5, wifi: 0.5}
algorithm:
  name: fedavg               # asynchronous: fedavg or fedprox
asynchronous:                # server steps on the virtual clock, no rounds to wait for (docs/async.md)
  mode: fedbuff              # or fedasync
  concurrency: 8             # clients in flight (<= clients.num_clients)
  buffer_size: 4             # fedbuff: updates per server step (<= concurrency)
  staleness: {kind: polynomial, a: 0.5}   # weight of an update tau versions old: (1+tau)^-a
  max_staleness: null        # an integer: older updates are dropped
"""

_ENERGY = """\
clients:
  num_clients: 20
  participation: 0.5
  profiles:
    devices: {phone_low: 0.5, laptop_cpu: 0.3, rpi4: 0.2}   # rpi4: mains-powered (docs/energy.md)
    network: {4g: 0.5, wifi: 0.5}
    battery:
      start: {low: 0.3, high: 1.0}   # charge at the start: a fraction, or a seeded uniform per client
      threshold: 0.2                 # below 20 % a selected client sits the round out
      charge_w: 10.0                 # charging power (W)
      charging: online               # never | always | online | hours
algorithm:
  name: fedavg
"""

_CONDITIONS = """\
clients:
  num_clients: 20
  participation: 0.5
  profiles:
    devices: {phone_mid: 0.5, laptop_cpu: 0.5}
    network: {5mbps: 0.5, 50mbps: 0.5}
    conditions:                      # processes over virtual time (docs/conditions.md)
      sets:
        fading:
          share: 0.5                 # half the clients (exact count, seeded)
          down: gilbert_elliott      # a preset (hetsim list presets): good/bad link states
          compute: thermal_throttling
        phones:
          share: 0.5
          availability: {preset: night_charging, tz_offset_h: {low: -3, high: 3}}
algorithm:
  name: fedavg
clock:
  start: "Tue 21:00"                 # virtual start time (day and hour matter for night_charging)
"""

TEMPLATES = {
    "sync": ("synchronous FedAvg rounds on a mixed fleet", _SYNC),
    "async": ("asynchronous FedBuff on the virtual clock", _ASYNC),
    "energy": ("phones with batteries and chargers", _ENERGY),
    "conditions": ("links, speeds and availability that change over time", _CONDITIONS),
}


# configs/<file> -> the template it holds
CONFIG_FILES = {
    "fedbuff_mnist.yaml": "async",
    "energy_mnist.yaml": "energy",
    "conditions_mnist.yaml": "conditions",
}


def render(name: str, file: str) -> str:
    """The text of template ``name`` for a file named ``file``."""
    what, body = TEMPLATES[name]
    return f"# Template {name!r}: {what}.\n" + _COMMON.format(file=file) + body


def config_text(file: str) -> str:
    """The text of ``configs/<file>``: its template, named as the repository's example."""
    return render(CONFIG_FILES[file], f"configs/{file}").replace(
        "# Template", f"# configs/{file} (`hetsim init {CONFIG_FILES[file]}` writes the same; "
        "from hetsim/templates.py)\n# Template", 1)


def write_configs(folder: Path) -> list[Path]:
    """Write every ``configs/`` example into ``folder``; returns their paths."""
    out = []
    for file in CONFIG_FILES:
        (folder / file).write_text(config_text(file))
        out.append(folder / file)
    return out


if __name__ == "__main__":  # python -m hetsim.templates [FOLDER]: rewrite the configs/ examples
    for path in write_configs(Path(sys.argv[1] if len(sys.argv) > 1 else "configs")):
        print(f"wrote {path}")
