"""A corpus of bad inputs: each must end in one clear message (naming the field and value, or
the file and line), exit status 2, no traceback, and no run folder left behind.

The table runs the CLI in-process (``hetsim.cli.main(argv)``); a few real subprocesses check
the exit-status and traceback boundary (including an unexpected error, which is a bug: exit 1,
traceback in a log file, only on the terminal with ``--debug``).
"""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from hetsim.cli import main

# fast: digits (1,797 samples) and an MLP; a case's own --set items come after these
BASE = ["--set", "dataset.name=digits", "--set", "model.name=mlp", "--set", "rounds=2",
        "--set", "clients.num_clients=10", "--set", "output.dir=runs"]


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


CLOSED = _closed_port()
GOOD_SPEC = {"base": "exp.yaml", "space": {"train.lr": {"grid": [0.01, 0.1]}}}
EXP = ("dataset: {name: digits}\nmodel: {name: mlp}\nrounds: 2\nclients: {num_clients: 10}\n"
       "output: {dir: runs}\n")

# 10 levels of 9 aliases: 9^9 nodes once expanded, from 300 bytes
BOMB = "a0: &a0 [lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))

# (id, command, argv after the command, files to create, words the message must contain)
CASES = [
    # ---- YAML: files, syntax, duplicates, empty, binary, --set values and keys
    ("yaml-missing-file", "run", ["-c", "nope.yaml"], {}, ["nope.yaml", "does not exist"]),
    ("yaml-directory", "run", ["-c", "adir"], {"adir/": None}, ["adir", "is a directory"]),
    ("yaml-empty", "run", ["-c", "e.yaml"], {"e.yaml": ""}, ["e.yaml", "is empty"]),
    ("yaml-comments-only", "validate", ["-c", "c.yaml"], {"c.yaml": "# nothing\n# here\n"},
     ["c.yaml", "is empty", "leave out -c"]),
    ("yaml-duplicate-key", "run", ["-c", "d.yaml"], {"d.yaml": "rounds: 2\nseed: 1\nrounds: 3\n"},
     ["d.yaml:3:1", "duplicate key 'rounds'", "line 1"]),
    ("yaml-duplicate-nested", "validate", ["-c", "d.yaml"],
     {"d.yaml": "train:\n  lr: 0.1\n  lr: 0.2\n"}, ["d.yaml:3:3", "duplicate key 'lr'"]),
    ("yaml-unclosed-list", "run", ["-c", "b.yaml"], {"b.yaml": "rounds: 2\nseed: [1, 2\n"},
     ["b.yaml:3:1", "invalid YAML"]),
    ("yaml-bad-indent", "validate", ["-c", "b.yaml"], {"b.yaml": "train:\n  lr: 1\n bad: 2\n"},
     ["b.yaml:3:2", "invalid YAML"]),
    ("yaml-tab", "validate", ["-c", "b.yaml"], {"b.yaml": "train:\n\tlr: 1\n"}, ["b.yaml:2:1", "invalid YAML"]),
    ("yaml-binary", "run", ["-c", "x.yaml"], {"x.yaml": b"\x7fELF\x02\x01\x01\x00\xff\xfe"},
     ["x.yaml", "not a UTF-8 text file"]),
    ("yaml-nul-bytes", "validate", ["-c", "x.yaml"], {"x.yaml": b"rounds: 2\x00\x00"}, ["x.yaml", "binary"]),
    ("yaml-list-not-mapping", "run", ["-c", "l.yaml"], {"l.yaml": "- 1\n- 2\n"}, ["l.yaml", "mapping", "list"]),
    ("yaml-scalar", "validate", ["-c", "s.yaml"], {"s.yaml": "hello\n"}, ["s.yaml", "mapping", "str"]),
    ("yaml-python-tag", "run", ["-c", "t.yaml"], {"t.yaml": "rounds: !!python/object:os.system x\n"},
     ["t.yaml:1:9", "invalid YAML"]),
    # ---- YAML limits: alias bombs, cycles, deep nesting (tests/engine/test_environment_faults.py: size, time)
    ("yaml-billion-laughs", "validate", ["-c", "bomb.yaml"], {"bomb.yaml": BOMB},
     ["bomb.yaml:6:", "YAML refused", "aliases expand to more than 100,000 nodes"]),
    ("yaml-recursive-alias", "run", ["-c", "cyc.yaml"], {"cyc.yaml": "rounds: 2\nx: &a [1, *a]\n"},
     ["cyc.yaml:2:11", "YAML refused", "alias *a refers to a node that contains it"]),
    ("yaml-deep-nesting", "validate", ["-c", "deep.yaml"], {"deep.yaml": "x: " + "[" * 5000 + "]" * 5000 + "\n"},
     ["deep.yaml:1:", "YAML refused", "nested deeper than 100 levels"]),
    ("set-deep-nesting", "run", ["--set", "train=" + "[" * 300 + "]" * 300], {},
     ["--set train", "nested deeper than 100 levels"]),
    ("sweep-billion-laughs", "sweep", ["s.yaml"], {"s.yaml": BOMB},
     ["s.yaml:6:", "aliases expand to more than 100,000 nodes"]),
    ("set-no-equals", "run", ["--set", "train.lr"], {}, ["train.lr", "key.path=value"]),
    ("set-double-dot", "run", ["--set", "train..lr=0.1"], {}, ["train..lr", "empty part"]),
    ("set-leading-dot", "validate", ["--set", ".lr=0.1"], {}, [".lr", "empty part"]),
    ("set-empty-key", "run", ["--set", "=3"], {}, ["''", "empty part"]),
    ("set-bad-yaml", "run", ["--set", "train.lr=[1"], {}, ["--set train.lr", "column", "invalid YAML"]),
    ("set-bad-flow-map", "validate", ["--set", "clients.profiles={devices: {rpi4: 1}"], {},
     ["--set clients.profiles", "invalid YAML"]),
    ("set-into-value", "run", ["--set", "rounds.x=1"], {}, ["rounds.x", "rounds", "not a section"]),
    ("set-dup-in-flow", "validate", ["--set", "train={lr: 1, lr: 2}"], {}, ["duplicate key 'lr'"]),
    # ---- booleans and non-finite numbers
    ("bool-rounds", "run", sets("rounds=true"), {}, ["rounds = True", "boolean where a number"]),
    ("bool-lr", "run", sets("train.lr=yes"), {}, ["train.lr = True", "boolean"]),
    ("bool-seed", "validate", sets("seed=false"), {}, ["seed = False", "boolean"]),
    ("bool-participation", "run", sets("clients.participation=true"), {}, ["clients.participation = True"]),
    ("bool-profile-availability", "run", sets("clients.profiles.availability=true"), {},
     ["clients.profiles.availability = True", "boolean"]),
    ("bool-override-gflops", "run", sets("clients.profiles.overrides={0: {gflops: true}}"), {},
     ["clients.profiles.overrides.0.gflops = True"]),
    ("bool-algorithm-k", "run", sets("algorithm.name=fedcspack", "algorithm.k=true"), {},
     ["algorithm.k = True", "boolean"]),
    ("bool-deadline", "validate", sets("clock.deadline_s=true"), {}, ["clock.deadline_s = True"]),
    ("inf-lr", "run", sets("train.lr=.inf"), {}, ["train.lr = inf", "not a finite number"]),
    ("nan-lr", "run", sets("train.lr=.nan"), {}, ["train.lr = nan", "not a finite number"]),
    ("inf-weight-decay", "run", sets("train.weight_decay=.inf"), {}, ["train.weight_decay = inf"]),
    ("inf-deadline", "validate", sets("clock.deadline_s=.inf"), {}, ["clock.deadline_s = inf"]),
    ("nan-in-file", "run", ["-c", "n.yaml"], {"n.yaml": "train:\n  momentum: .nan\n"},
     ["train.momentum = nan"]),
    ("inf-in-list", "validate", sets("model.params={hidden: [.inf]}"), {}, ["model.params.hidden[0] = inf"]),
    ("neg-inf-mu", "run", sets("algorithm.name=fedprox", "algorithm.mu=-.inf"), {}, ["algorithm.mu = -inf"]),
    # ---- schema: unknown keys, types, ranges
    ("unknown-top-key", "run", sets("roundz=3"), {}, ["roundz", "unknown key", "rounds"]),
    ("unknown-train-key", "run", sets("train.learning_rate=0.1"), {}, ["train.learning_rate", "allowed keys"]),
    ("unknown-algorithm", "run", sets("algorithm.name=fedfoo"), {}, ["fedfoo", "fedavg"]),
    ("algorithm-key-other-method", "run", sets("algorithm.mu=0.1"), {}, ["algorithm.mu", "unknown key"]),
    ("unknown-dataset", "run", sets("dataset.name=imagenet"), {}, ["imagenet", "mnist5k"]),
    ("unknown-model", "validate", sets("model.name=vgg"), {}, ["vgg", "lenet5"]),
    ("unknown-scheme", "run", sets("partition.scheme=random"), {}, ["partition.scheme", "random", "dirichlet"]),
    ("unknown-executor", "run", sets("executor.kind=gpu"), {}, ["executor.kind", "gpu", "ray"]),
    ("unknown-clock-mode", "run", sets("clock.mode=fast"), {}, ["clock.mode", "fast", "realtime"]),
    ("unknown-on-nonfinite", "run", sets("train.on_nonfinite=retry"), {}, ["train.on_nonfinite", "skip_client"]),
    ("rounds-zero", "run", sets("rounds=0"), {}, ["rounds = 0", "greater than or equal to 1"]),
    ("rounds-string", "run", sets("rounds=abc"), {}, ["rounds = 'abc'", "integer"]),
    ("rounds-float", "validate", sets("rounds=2.5"), {}, ["rounds = 2.5", "integer"]),
    ("lr-negative", "run", sets("train.lr=-1"), {}, ["train.lr = -1", "greater than 0"]),
    ("momentum-one", "run", sets("train.momentum=1"), {}, ["train.momentum = 1", "less than 1"]),
    ("participation-big", "run", sets("clients.participation=1.5"), {}, ["clients.participation = 1.5"]),
    ("num-clients-zero", "run", sets("clients.num_clients=0"), {}, ["clients.num_clients = 0"]),
    ("batch-zero", "run", sets("train.batch_size=0"), {}, ["train.batch_size = 0"]),
    ("epochs-negative", "validate", sets("train.local_epochs=-2"), {}, ["train.local_epochs = -2"]),
    ("lr-decay-big", "run", sets("train.lr_decay=2"), {}, ["train.lr_decay = 2"]),
    ("alpha-zero", "run", sets("partition.alpha=0"), {}, ["partition.alpha = 0"]),
    ("test-fraction-one", "run", sets("partition.test_fraction=1"), {}, ["partition.test_fraction = 1"]),
    ("public-fraction-neg", "run", sets("partition.public_fraction=-0.1"), {}, ["partition.public_fraction = -0.1"]),
    ("eval-every-zero", "run", sets("evaluation.eval_every=0"), {}, ["evaluation.eval_every = 0"]),
    ("deadline-negative", "run", sets("clock.deadline_s=-1"), {}, ["deadline_s=-1", "must be > 0"]),
    ("over-selection-small", "run", sets("clock.over_selection=0.5"), {}, ["over_selection=0.5", ">= 1.0"]),
    ("time-scale-negative", "validate", sets("clock.time_scale=-1"), {}, ["time_scale=-1", ">= 0"]),
    ("cpus-per-actor-zero", "run", sets("executor.cpus_per_actor=0"), {}, ["executor.cpus_per_actor = 0"]),
    ("startup-timeout-zero", "run", sets("executor.startup_timeout_s=0"), {}, ["executor.startup_timeout_s = 0"]),
    ("connect-timeout-zero", "run", sets("ray.connect_timeout_s=0"), {}, ["ray.connect_timeout_s = 0"]),
    ("ray-address-garbage", "run", sets("ray.address=not an address"), {}, ["ray.address", "host:port"]),
    ("ray-address-no-port", "validate", sets("ray.address=head"), {}, ["ray.address", "'head'", "host:port"]),
    ("fedprox-mu-negative", "run", sets("algorithm.name=fedprox", "algorithm.mu=-1"), {}, ["algorithm.mu = -1"]),
    ("compressed-k-zero", "run", sets("algorithm.name=fedavg_compressed", "algorithm.k=0"), {}, ["algorithm.k", "k=0"]),
    ("compressed-k-ratio-big", "run", sets("algorithm.name=fedavg_compressed", "algorithm.k=1.5"), {},
     ["algorithm.k", "1.5", "(0, 1]"]),
    ("compressed-unknown-compressor", "run", sets("algorithm.name=fedavg_compressed", "algorithm.compressor=zip"), {},
     ["algorithm.compressor", "zip", "topk"]),
    ("fedcspack-pack-size-zero", "run", sets("algorithm.name=fedcspack", "algorithm.pack_size=0"), {},
     ["algorithm.pack_size", "pack_size must be an integer >= 1"]),
    ("fedcspack-k-string", "run", sets("algorithm.name=fedcspack", "algorithm.k=some"), {}, ["algorithm.k", "'some'"]),
    ("ascend-eps-min-big", "run", sets("algorithm.name=ascend", "algorithm.eps_min=2"), {}, ["algorithm.eps_min = 2"]),
    ("ascend-fixed-without-arm", "run", sets("algorithm.name=ascend", "algorithm.policy=fixed"), {},
     ["algorithm", "arm is required with policy 'fixed'"]),
    ("profiles-devices-sum", "run", sets("clients.profiles.devices={rpi4: 0.5}"), {},
     ["devices proportions sum to 0.5"]),
    ("profiles-network-and-bandwidth", "run",
     sets("clients.profiles.network={50mbps: 1}", "clients.profiles.bandwidth={low: 5, high: 10}"), {},
     ["either 'network'", "not both"]),
    ("profiles-dropout-big", "run", sets("clients.profiles.dropout=1.5"), {}, ["dropout=1.5", "[0, 1]"]),
    ("profiles-unknown-key", "run", sets("clients.profiles.speed=3"), {}, ["clients.profiles.speed", "unknown key"]),
    ("output-name-path", "run", sets("output.name=a/b"), {}, ["output.name", "'a/b'", "one folder name"]),
    ("output-dir-undefined-var", "run", sets("output.dir=$HETSIM_NOT_SET_XYZ/runs"), {},
     ["output.dir", "HETSIM_NOT_SET_XYZ", "is not set"]),
    ("dataset-root-undefined-var", "validate", sets("dataset.root=${HETSIM_NOT_SET_XYZ}"), {},
     ["dataset.root", "HETSIM_NOT_SET_XYZ"]),
    ("inject-failure-negative", "run", sets("executor.inject_failure={round: -1, client: 0}"), {},
     ["executor.inject_failure.round = -1"]),
    # ---- cross-field and data-dependent (the validation pass)
    ("model-does-not-fit-data", "run", sets("model.name=cnn"), {},
     ["model.name = 'cnn'", "input shape (64,)", "accepts (C, H, W)"]),
    ("model-resnet-on-digits", "validate", sets("model.name=resnet18"), {}, ["model.name = 'resnet18'", "(64,)"]),
    ("model-unknown-param", "run", sets("model.params={hidden: [8], depth: 3}"), {},
     ["model.params.depth = 3", "unknown parameter of model 'mlp'", "allowed: hidden, width"]),
    ("model-param-bad-width", "run", sets("model.params={hidden: [8], width: 3}"), {},
     ["model.name = 'mlp'", "width=3 is not allowed: a fraction in (0, 1]"]),
    ("model-param-wrong-type", "run", sets("model.params={hidden: 5}"), {},
     ["model.name = 'mlp'", "'hidden': 5", "not iterable"]),
    ("model-param-negative-width", "run", sets("model.params={hidden: [-3]}"), {},
     ["model.name = 'mlp'", "hidden widths must be positive"]),
    ("dataset-unknown-param", "run", sets("dataset.params={flat: true, size: 3}"), {},
     ["dataset.params.size = 3", "unknown parameter of dataset 'digits'", "allowed: flat"]),
    ("synthetic-bad-param", "run", sets("dataset.name=synthetic", "dataset.params={num_features: 0}"), {},
     ["dataset 'synthetic'", "num_features=0"]),
    ("arch-params-unused-arch", "run", sets("model.arch_params={cnn: {}}"), {},
     ["model.arch_params.cnn", "not an architecture of this run"]),
    ("more-clients-than-samples", "run", sets("clients.num_clients=5000"), {},
     ["partition.scheme = 'dirichlet'", "clients.num_clients = 5000", "1438 samples"]),
    ("dirichlet-impossible", "run", sets("partition.min_samples=500"), {},
     ["min_samples=500", "exceeds the 1438 samples"]),
    ("dirichlet-never-succeeds", "run", sets("clients.num_clients=100", "partition.alpha=0.001",
                                               "partition.min_samples=14"), {},
     ["partition.scheme = 'dirichlet'", "failed after max_retries"]),
    ("shards-impossible", "run", sets("partition.scheme=shards", "partition.shards_per_client=500"), {},
     ["partition.scheme = 'shards'", "shards_per_client=500"]),
    ("natural-without-natural-clients", "run", sets("partition.scheme=natural"), {},
     ["partition.scheme = 'natural'", "needs a dataset with natural clients"]),
    ("natural-wrong-count", "run", sets("dataset.name=synthetic", "partition.scheme=natural",
                                        "dataset.params={num_clients: 30}"), {},
     ["partition.scheme = 'natural'", "does not match the 30 natural clients"]),
    ("no-global-test-set", "run", sets("partition.global_test_fraction=0.0001"), {},
     ["partition.global_test_fraction", "no global test samples"]),
    ("per-client-out-of-range", "run", sets("model.per_client={40: mlp}"), {},
     ["model.per_client", "client id 40 out of range [0, 10)"]),
    ("profile-override-out-of-range", "run", sets("clients.profiles.overrides={50: {gflops: 1}}"), {},
     ["clients.profiles", "client id 50", "num_clients (10)"]),
    ("profile-bandwidth-out-of-range", "run", sets("clients.profiles.bandwidth={low: 1, high: 2}"), {},
     ["clients.profiles", "outside the catalog range", "clients.profiles.allow_out_of_range: true"]),
    ("profile-unknown-device-tier", "run", sets("clients.profiles.devices={gpu9000: 1.0}"), {},
     ["clients.profiles", "unknown device tier 'gpu9000'", "rpi4"]),
    ("profile-unknown-network-tier", "validate", sets("clients.profiles.bandwidth=null",
                                                         "clients.profiles.network={6g: 1.0}"), {},
     ["clients.profiles", "unknown network tier '6g'"]),
    ("profile-override-unknown-tier", "run", sets("clients.profiles.overrides={1: {tier: quantum}}"), {},
     ["unknown device tier 'quantum'"]),
    ("profile-table-missing", "run", sets("clients.profiles.table=nope.csv"), {}, ["nope.csv"]),
    ("profile-table-bad-extension", "run", sets("clients.profiles.table=t.txt"), {"t.txt": "a,b\n"},
     ["clients.profiles", "t.txt", "unsupported extension"]),
    ("profile-table-wrong-rows", "run", sets("clients.profiles.table=t.csv"), {"t.csv": "gflops\n1\n2\n"},
     ["clients.profiles", "2 rows", "(10)"]),
    ("ascend-without-public-split", "run", sets("algorithm.name=ascend"), {},
     ["algorithm.name = 'ascend'", "public split", "partition.public_fraction"]),
    ("fedcspack-pack-bigger-than-model", "run", sets("algorithm.name=fedcspack", "algorithm.pack_size=100000"), {},
     ["algorithm.pack_size = 100000", "4,810 parameters", "pack_size <= 4810"]),
    ("fedcspack-k-more-packs", "run", sets("algorithm.name=fedcspack", "algorithm.k=1000"), {},
     ["algorithm.k = 1000", "5 packs", "k <= 5"]),
    ("compressed-k-bigger-than-model", "run", sets("algorithm.name=fedavg_compressed", "algorithm.k=100000"), {},
     ["algorithm.k = 100000", "4,810 parameters", "clamp_k"]),
    ("ascend-k-bigger-than-model", "run", sets("algorithm.name=ascend", "partition.public_fraction=0.1",
                                               "algorithm.k=99999"), {}, ["algorithm.k = 99999"]),
    ("inject-failure-no-such-client", "run", sets("executor.inject_failure={round: 0, client: 99}"), {},
     ["executor.inject_failure.client = 99", "0..9"]),
    ("inject-failure-no-such-round", "run", sets("executor.inject_failure={round: 5, client: 1}"), {},
     ["executor.inject_failure.round = 5", "rounds 0..1"]),
    ("ray-pool-larger-than-cpus", "run", sets("executor.kind=ray", "ray.num_cpus=2", "executor.num_actors=64"), {},
     ["executor: num_actors=64", "ray.num_cpus"]),
    ("ray-cpus-per-actor-too-big", "run", sets("executor.kind=ray", "ray.num_cpus=2", "executor.cpus_per_actor=8"), {},
     ["cpus_per_actor=8", "exceeds the cluster's 2 CPUs"]),
    ("ray-num-cpus-with-address", "run", sets("ray.address=auto", "ray.num_cpus=2"), {},
     ["ray.num_cpus = 2", "ray.address = 'auto'"]),
    ("ray-unreachable-address", "run", sets("executor.kind=ray", f"ray.address=127.0.0.1:{CLOSED}",
                                            "ray.connect_timeout_s=5"), {},
     [f"ray.address = '127.0.0.1:{CLOSED}'", "Connection refused", "ray.connect_timeout_s"]),
    ("ray-unresolvable-address", "run", sets("executor.kind=ray", "ray.address=nohost.invalid:6379",
                                             "ray.connect_timeout_s=5"), {},
     ["ray.address = 'nohost.invalid:6379'", "cannot reach"]),
    ("realtime-huge-time-scale", "run", sets("clock.mode=realtime", "clock.time_scale=1e12"), {},
     ["clock.time_scale = 1000000000000.0", "clock.max_sleep_s"]),
    # ---- degenerate fleets
    ("fleet-availability-zero", "run", sets("clients.profiles.availability=0"), {},
     ["clients.profiles", "no client can ever arrive", "availability is 0"]),
    ("fleet-dropout-one", "run", sets("clients.profiles.dropout=1"), {},
     ["no client can ever arrive", "dropout is 1"]),
    ("fleet-mixed-never-arrive", "run", sets("clients.profiles.availability=0",
                                             "clients.profiles.overrides={3: {availability: 1, dropout: 1}}"), {},
     ["no client can ever arrive"]),
    ("fleet-deadline-impossible", "run", sets("clock.deadline_s=0.000001"), {},
     ["clock.deadline_s = 1e-06", "no client can finish a round in time", "deadline_s >="]),
    # latencies alone (2 x 0.05 s) fit 0.12 s; the MLP's 19 KB each way at 5 Mbit/s do not
    ("fleet-deadline-counts-transfers", "run",
     sets("clients.profiles={devices: {laptop_cpu: 1.0}, network: {5mbps: 1.0}}", "clock.deadline_s=0.12"), {},
     ["clock.deadline_s = 0.12", "no client can finish", "needs at least 0.162 s"]),
    ("fleet-deadline-impossible-slow-devices", "run",
     sets("clients.profiles.devices={rpi4: 1.0}", "clock.deadline_s=0.01", "train.local_epochs=50"), {},
     ["clock.deadline_s = 0.01", "no client can finish"]),
    ("whatif-target-out-of-range", "whatif", ["--fleet", "a=f.yaml", "--target", "2"],
     {"f.yaml": "devices: {rpi4: 1.0}"}, ["--target 2 is outside the allowed range", "[0, 1]"]),
    # ---- output folders
    ("output-dir-is-a-file", "run", sets("output.dir=afile/runs"), {"afile": "x"},
     ["output.dir = 'afile/runs'", "'afile' is a file"]),
    ("out-is-a-file", "run", ["-o", "afile"], {"afile": "x"}, ["afile", "is a file"]),
    ("out-existing-run", "run", ["-o", "old"], {"old/manifest.json": "{}", "old/config.yaml": "{}"},
     ["run folder old already exists", "output.overwrite: true"]),
    ("out-existing-nonrun-with-overwrite", "run", ["-o", "data", "--set", "output.overwrite=true"],
     {"data/precious.txt": "keep"}, ["data is not empty", "no manifest.json", "refusing to delete"]),
    ("output-name-existing", "run", sets("output.name=r1"), {"runs/r1/manifest.json": "{}"},
     ["run folder runs/r1 already exists", "output.name"]),
    ("output-name-nul", "run", sets('output.name="a\\0b"'), {},
     ["output.name = 'a\\x00b'", "control character(s) '\\x00'"]),
    ("output-name-300-chars", "validate", sets("output.name=" + "n" * 300), {},
     ["output.name = 'nnnn", "300 bytes long", "at most 255 bytes"]),
    ("output-name-separator", "run", sets("output.name=a/b"), {}, ["output.name = 'a/b'", "one folder name"]),
    ("out-name-too-long", "run", ["-o", "y" * 300], {}, ["yyyy", "the file name is too long"]),
    # ---- show: missing and broken run folders
    ("show-missing", "show", ["nowhere"], {}, ["nowhere does not exist"]),
    ("show-a-file", "show", ["f.txt"], {"f.txt": "x"}, ["f.txt is a file"]),
    ("show-not-a-run", "show", ["empty"], {"empty/": None}, ["empty is not a run folder", "no manifest.json"]),
    ("show-bad-manifest", "show", ["r"], {"r/manifest.json": "{not json"}, ["manifest.json is damaged", "JSON"]),
    ("show-manifest-not-object", "show", ["r"], {"r/manifest.json": "[1, 2]"}, ["holds a JSON list, not a manifest"]),
    ("show-truncated-parquet", "show", ["r"], {"r/manifest.json": '{"status": "finished"}',
                                             "r/rounds.parquet": b"PAR1\x00\x00garbage"},
     ["rounds.parquet is unreadable", "truncated"]),
    ("show-truncated-part", "show", ["r"], {"r/manifest.json": '{"status": "running"}',
                                          "r/_parts/rounds/0000000.parquet": b"PAR1"},
     ["0000000.parquet is unreadable"]),
    # ---- sweeps: spec and base problems
    ("sweep-missing-spec", "sweep", ["nospec.yaml"], {}, ["nospec.yaml", "does not exist"]),
    ("sweep-bad-yaml", "sweep", ["s.yaml"], {"s.yaml": "space:\n  train.lr: {grid: [1, 2}\n"},
     ["s.yaml:2:", "invalid YAML"]),
    ("sweep-duplicate-key", "sweep", ["s.yaml"], {"s.yaml": "space: {}\nspace: {}\n"},
     ["s.yaml:2:1", "duplicate key 'space'"]),
    ("sweep-empty", "sweep", ["s.yaml"], {"s.yaml": "# nothing\n"}, ["s.yaml", "is empty"]),
    ("sweep-unknown-key", "sweep", ["s.yaml"], {"s.yaml": "spaces: {}\n"}, ["spaces", "unknown key"]),
    ("sweep-base-missing", "sweep", ["s.yaml"], {"s.yaml": "base: none.yaml\nspace: {train.lr: {grid: [0.1]}}\n"},
     ["base", "none.yaml", "does not exist"]),
    ("sweep-base-bad-yaml", "sweep", ["s.yaml"], {"s.yaml": json.dumps(GOOD_SPEC), "exp.yaml": "rounds: [\n"},
     ["exp.yaml:2:1", "invalid YAML"]),
    ("sweep-space-value-rejected", "sweep", ["s.yaml"],
     {"s.yaml": "base: exp.yaml\nspace: {train.lr: {grid: [0.1, -1]}}\n", "exp.yaml": EXP},
     ["space.train.lr.grid", "value -1", "train.lr"]),
    ("sweep-space-data-problem", "sweep", ["s.yaml"],
     {"s.yaml": "base: exp.yaml\nspace: {clients.num_clients: {grid: [10, 9000]}}\n", "exp.yaml": EXP},
     ["space.clients.num_clients.grid", "value 9000", "1438 samples"]),
    ("sweep-base-data-problem", "sweep", ["s.yaml"],
     {"s.yaml": json.dumps(GOOD_SPEC), "exp.yaml": EXP + "algorithm: {name: ascend}\n"},
     ["base", "public split"]),
    ("sweep-space-inf", "sweep", ["s.yaml"],
     {"s.yaml": "base: exp.yaml\nspace: {train.lr: {grid: [.inf]}}\n", "exp.yaml": EXP}, ["train.lr = inf"]),
    ("sweep-resume-missing", "sweep", ["--resume", "nowhere"], {}, ["nowhere", "not a sweep folder"]),
    ("sweep-resume-bad-sweep-yaml", "sweep", ["--resume", "sw"], {"sw/sweep.yaml": "spec: {a: 1\n"},
     ["sweep.yaml:2:1", "invalid YAML"]),
    ("sweep-resume-foreign-sweep-yaml", "sweep", ["--resume", "sw"], {"sw/sweep.yaml": "x: 1\n"},
     ["sweep.yaml", "not a sweep file written by hetsim"]),
    ("sweep-spec-and-resume", "sweep", ["s.yaml", "--resume", "sw"], {}, ["give a spec file or --resume"]),
]
assert len(CASES) >= 100, len(CASES)


def _make_files(root: Path, files: dict) -> None:
    for name, content in files.items():
        path = root / name
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case_id, command, argv, files, words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_message_and_exit_2(case_id, command, argv, files, words,
                                                      tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HETSIM_NOT_SET_XYZ", raising=False)
    _make_files(tmp_path, files)
    before = _tree(tmp_path)
    full = [command, *argv] if command in ("show", "sweep") else [command, *BASE, *argv]
    code = main(full)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    assert err.startswith("hetsim: ") and out == "", (out, err)
    for word in words:
        assert word in err, (word, err)
    assert _tree(tmp_path) == before, "nothing may be written for a bad input"


def _hetsim(*args, cwd, code=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "hetsim", *args] if code is None else [sys.executable, "-c", code, *args]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_real_process_config_error_exit_2_without_traceback(tmp_path):
    (tmp_path / "bad.yaml").write_text("train:\n  lr: 0.1\n  lr: 0.2\n")
    out = _hetsim("run", "-c", "bad.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == ("hetsim: bad.yaml:3:3: invalid YAML: duplicate key 'lr' (first "
                                  "given on line 2); give each key once")
    assert out.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_real_process_argparse_error_exit_2(tmp_path):
    out = _hetsim("run", "--no-such-flag", cwd=tmp_path)
    assert out.returncode == 2 and "unrecognized arguments: --no-such-flag" in out.stderr
    assert "Traceback" not in out.stderr


BUG = """
import sys
import engine.loop.simulation as sim
def broken_round(self, r):
    raise ZeroDivisionError("a bug in the round loop")
sim.Simulation.run_round = broken_round
from hetsim.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("debug", [False, True])
def test_real_process_unexpected_error_exit_1_traceback_in_the_run_folder(tmp_path, debug):
    args = ["run", "-q", "-o", "r", *BASE] + (["--debug"] if debug else [])
    out = _hetsim(*args, cwd=tmp_path, code=BUG)
    assert out.returncode == 1, out.stderr
    log = tmp_path / "r" / "error.log"
    assert f"the traceback is in {log.resolve()}" in out.stderr
    assert "ZeroDivisionError: a bug in the round loop" in out.stderr
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "broken_round" in text
    assert ("Traceback" in out.stderr) == debug  # on the terminal only with --debug
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "ZeroDivisionError" in manifest["error"]


def test_unexpected_error_before_a_run_folder_goes_to_a_temp_log(tmp_path, monkeypatch, capsys):
    import engine

    def broken(cfg, run_dir=None):
        raise KeyError("internal")

    monkeypatch.setattr(engine, "validate_experiment", broken)  # the CLI takes it from the face
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    assert main(["validate", *BASE]) == 1
    err = capsys.readouterr().err
    logs = list(tmp_path.glob("hetsim-error-*.log"))
    assert len(logs) == 1 and f"the traceback is in {logs[0]}" in err
    assert "Traceback" not in err and "KeyError" in logs[0].read_text()


def test_degenerate_but_runnable_experiments_warn_loudly_and_record_it(tmp_path, monkeypatch, capsys):
    from engine.config.schema import load_config
    from engine.loop.selection import select_clients

    monkeypatch.chdir(tmp_path)
    few = sets("partition.public_fraction=0.9", "partition.min_samples=1", "clients.num_clients=30",
               "rounds=1")
    assert main(["run", "-q", "-o", "r", *BASE, *few]) == 0
    captured = capsys.readouterr()
    assert "hetsim: warning: clients hold 3.5 local training samples on average (min 1" in captured.err
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and "3.5 local training samples" in manifest["warnings"][0]
    assert "warning" in captured.out  # hetsim run's summary (hetsim show) repeats it

    cfg = load_config(None, [*BASE[1::2]])
    selected, _ = select_clients(cfg, cfg.clients.num_clients, 0)
    absent = next(c for c in range(cfg.clients.num_clients) if c not in selected)
    assert main(["validate", *BASE, *sets(f"executor.inject_failure={{round: 0, client: {absent}}}")]) == 0
    assert (f"hetsim: warning: executor.inject_failure: client {absent} is not selected in round 0"
            in capsys.readouterr().err)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_output_dir_that_is_not_writable_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "locked").mkdir(mode=0o555)
    try:
        assert main(["run", *BASE, *sets("output.dir=locked/runs")]) == 2
    finally:
        (tmp_path / "locked").chmod(0o755)
    err = capsys.readouterr().err
    assert "output.dir = 'locked/runs'" in err and "not writable" in err
