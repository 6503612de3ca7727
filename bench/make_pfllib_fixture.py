"""Write tests/engine/data/pfllib_splits.json: what PFLlib's own split code gives, per client, for
a few settings, so that the test of ``partition.scheme: pfllib`` needs neither PFLlib nor internet.

    git clone https://github.com/TsingZ0/PFLlib /tmp/PFLlib               # the commit in the fixture
    git clone https://github.com/NigeloYang/FedCSPACK /tmp/FedCSPACK      # its copy of the split code
    .venv/bin/python bench/make_pfllib_fixture.py --pfllib /tmp/PFLlib --fedcspack /tmp/FedCSPACK
    .venv/bin/python bench/make_pfllib_fixture.py --pfllib ... --fedcspack ... --check   # compare only

PFLlib's code is run, never copied: its ``dataset/utils/dataset_utils.py`` (``separate_data``, then
``split_data``) is imported from the checkout given, seeded as its ``generate_*.py`` scripts seed it
(``random.seed(s); np.random.seed(s)``, then nothing else draws before the split), on the labels of
datasets hetsim ships (mnist5k, digits; Fashion-MNIST when Debian's dataset-fashion-mnist is
installed), the official test rows after the training rows as PFLlib concatenates them. The rows
are passed as their pool positions (``np.arange``) in place of the images, so the output names
the very rows each client gets. Per case the file keeps each client's train and test sizes and
label counts and a SHA-256 of its rows (each client's positions sorted, int64 little-endian,
client after client); ``nan_cast`` says whether PFLlib cast a 0/0 proportion to an integer there
(its result then depends on the CPU: on x86-64 the whole class goes to one client).

Without the checkouts it says what is missing and exits with status 2: the fixture in the
repository is what a run with them wrote (the provenance in the file says which commits).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import random
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIXTURE = REPO / "tests" / "engine" / "data" / "pfllib_splits.json"
SPLIT_FILE = "dataset/utils/dataset_utils.py"

# (name, dataset, variant, split, settings): settings are partition.pfllib's fields plus alpha,
# train_ratio (1 - partition.test_fraction) and num_clients
CASES = [
    ("pfllib-dir-mnist5k", "mnist5k", "pfllib", "dir", dict(alpha=0.1, num_clients=20)),
    ("pfllib-pat-balanced", "mnist5k", "pfllib", "pat", dict(class_per_client=2, num_clients=20)),
    ("pfllib-pat-unbalanced", "mnist5k", "pfllib", "pat", dict(class_per_client=2, balance=False,
                                                                num_clients=20, seed=3)),
    ("pfllib-exdir-alpha100", "digits", "pfllib", "exdir", dict(alpha=100.0, class_per_client=2, num_clients=10)),
    ("pfllib-exdir-alpha0.1", "digits", "pfllib", "exdir", dict(alpha=0.1, class_per_client=3, num_clients=20)),
    ("pfllib-iid-unbalanced", "digits", "pfllib", "iid", dict(balance=False, num_clients=10, seed=7)),
    ("fedcspack-dir0.3-mnist5k", "mnist5k", "fedcspack", "dir", dict(alpha=0.3, batch_size=16, num_clients=20)),
    ("fedcspack-pat-unbalanced", "mnist5k", "fedcspack", "pat", dict(class_per_client=3, balance=False,
                                                                      batch_size=16, train_ratio=0.8,
                                                                      num_clients=20)),
    ("fedcspack-exdir-unbalanced", "digits", "fedcspack", "exdir", dict(alpha=0.3, class_per_client=2,
                                                                         balance=False, num_clients=12)),
    ("fedcspack-dir0.3-fmnist", "fashion_mnist", "fedcspack", "dir", dict(alpha=0.3, batch_size=16,
                                                                           num_clients=20)),
]
DEFAULTS = dict(balance=True, class_per_client=2, batch_size=10, seed=1, alpha=0.1, train_ratio=0.75)


def pool_labels(dataset: str) -> np.ndarray:
    """The dataset's labels in pool order: training rows, then the official test rows."""
    from engine.data.datasets import load_dataset

    ds = load_dataset(dataset)
    return np.concatenate([ds.y, ds.test_y]) if ds.test_y is not None else np.asarray(ds.y)


def digest(parts: list[np.ndarray]) -> str:
    """SHA-256 of each client's positions, sorted, int64 little-endian, client after client."""
    h = hashlib.sha256()
    for rows in parts:
        h.update(np.sort(np.asarray(rows, dtype=np.int64)).astype("<i8").tobytes())
    return h.hexdigest()


def summary(train: list[np.ndarray], test: list[np.ndarray], labels: np.ndarray) -> dict:
    k = int(labels.max()) + 1

    def counts(parts):
        return [np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=k).tolist() for p in parts]

    return {"train_sizes": [len(p) for p in train], "test_sizes": [len(p) for p in test],
            "train_label_counts": counts(train), "test_label_counts": counts(test),
            "train_sha256": digest(train), "test_sha256": digest(test)}


def dumps(obj) -> str:
    """JSON with every list of numbers on one line (the label counts: a line per client)."""
    one_line = lambda m: re.sub(r"\s+", " ", m.group(0)).replace("[ ", "[").replace(" ]", "]")  # noqa: E731
    return re.sub(r"\[[-0-9.,\s]*\]", one_line, json.dumps(obj, indent=1)) + "\n"


def load_split_module(checkout: Path, name: str) -> types.ModuleType:
    """The checkout's dataset_utils.py as a module (ujson, which only its file helpers use, stubbed
    when it is not installed)."""
    if "ujson" not in sys.modules and importlib.util.find_spec("ujson") is None:
        sys.modules["ujson"] = json
    spec = importlib.util.spec_from_file_location(name, checkout / SPLIT_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_reference(module: types.ModuleType, variant: str, split: str, s: dict, labels: np.ndarray):
    """(train rows, test rows, whether a NaN was cast) per client from the reference's own functions."""
    random.seed(s["seed"])
    np.random.seed(s["seed"])
    rows = np.arange(len(labels))
    k = len(set(labels.tolist()))
    niid, partition = split != "iid", "pat" if split == "iid" else split
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("always")
        if variant == "pfllib":  # its settings are module globals, read when the functions run
            module.batch_size, module.train_ratio, module.alpha = s["batch_size"], s["train_ratio"], s["alpha"]
            x, _, _ = module.separate_data((rows, labels), s["num_clients"], k, niid, s["balance"], partition,
                                           class_per_client=s["class_per_client"])
            train, test = module.split_data(x, [labels[p] for p in x])
        else:
            args = argparse.Namespace(num_clients=s["num_clients"], niid="noniid" if niid else "iid",
                                      balance="balance" if s["balance"] else "unbalance", partition=partition,
                                      class_per_client=s["class_per_client"], batch_size=s["batch_size"],
                                      train_ratio=s["train_ratio"], alpha=s["alpha"])
            x, _, _ = module.separate_data((rows, labels), k, args)
            train, test = module.split_data(x, [labels[p] for p in x], s["train_ratio"])
    nan_cast = any("invalid value encountered" in str(w.message) for w in caught)
    return [d["x"] for d in train], [d["x"] for d in test], nan_cast


def commit_of(checkout: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pfllib", type=Path, required=True, help="a checkout of github.com/TsingZ0/PFLlib")
    p.add_argument("--fedcspack", type=Path, required=True, help="a checkout of github.com/NigeloYang/FedCSPACK")
    p.add_argument("--out", type=Path, default=FIXTURE)
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = p.parse_args(argv)
    checkouts = {"pfllib": args.pfllib, "fedcspack": args.fedcspack}
    missing = [f"{c / SPLIT_FILE}" for c in checkouts.values() if not (c / SPLIT_FILE).is_file()]
    if missing:
        print(f"PFLlib's split code is not here: {', '.join(missing)} not found. Clone the repositories "
              "(see this script's docstring) and pass their folders; the fixture in the repository stays "
              "as it is.", file=sys.stderr)
        return 2
    modules = {v: load_split_module(c, f"reference_split_{v}") for v, c in checkouts.items()}
    import sklearn

    out = {"provenance": {
        "written_by": "bench/make_pfllib_fixture.py",
        "pfllib": {"repository": "https://github.com/TsingZ0/PFLlib", "commit": commit_of(args.pfllib),
                   "file": SPLIT_FILE, "functions": ["separate_data", "split_data"]},
        "fedcspack": {"repository": "https://github.com/NigeloYang/FedCSPACK", "commit": commit_of(args.fedcspack),
                      "file": SPLIT_FILE, "functions": ["separate_data", "split_data"]},
        "numpy": np.__version__, "scikit-learn": sklearn.__version__,
        "seeding": "random.seed(seed); np.random.seed(seed) just before separate_data, as generate_*.py do",
        "rows": "pool positions: the dataset's training rows, then its official test rows"},
        "cases": []}
    for name, dataset, variant, split, settings in CASES:
        s = {**DEFAULTS, **settings}
        try:
            labels = pool_labels(dataset)
        except Exception as err:  # noqa: BLE001 - a dataset not installed here: that case is left out
            print(f"{name}: {dataset} not available ({err}); left out", file=sys.stderr)
            continue
        train, test, nan_cast = run_reference(modules[variant], variant, split, s, labels)
        out["cases"].append({"name": name, "dataset": dataset, "variant": variant, "split": split, **s,
                             "nan_cast": nan_cast, **summary(train, test, labels)})
        print(f"{name}: {len(train)} clients, train {sum(map(len, train))} rows, test {sum(map(len, test))}"
              f"{', NaN cast' if nan_cast else ''}")
    text = dumps(out)
    if args.check:
        same = args.out.read_text() == text
        print("the fixture matches" if same else f"{args.out} differs from what PFLlib's code gives now")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
