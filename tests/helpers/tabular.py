"""A LEAF dataset written as its documentation describes, and a run's tables without wall clock:
the data tests, the on-demand tests and the cluster tests share them."""
import json

import numpy as np

from engine.results.tables import WALL_COLUMNS

USERS = [f"f{i:04d}_{i % 3}" for i in range(6)]
FEATURES = 8


def write_leaf(folder, seed=0):
    """Six users in LEAF's documented format, train split over two files, test in one."""
    rng = np.random.default_rng(seed)
    data = {}
    for i, u in enumerate(USERS):
        n_train, n_test = 20 + 3 * i, 4 + i % 2
        x = rng.normal(size=(n_train + n_test, FEATURES)).round(4)
        y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
        data[u] = (x, y, n_train)
    for split in ("train", "test"):
        (folder / split).mkdir(parents=True)
        groups = [USERS[:3], USERS[3:]] if split == "train" else [USERS]
        for j, users in enumerate(groups):
            doc = {"users": users, "num_samples": [], "user_data": {}}
            for u in users:
                x, y, n = data[u]
                sl = slice(0, n) if split == "train" else slice(n, None)
                doc["num_samples"].append(len(y[sl]))
                doc["user_data"][u] = {"x": x[sl].tolist(), "y": y[sl].tolist()}
            (folder / split / f"all_data_{j}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return data


def comparable_tables(run) -> dict:
    """The run's rounds and clients tables, which equal runs give equal."""
    return {n: getattr(run, n).drop(columns=list(WALL_COLUMNS), errors="ignore") for n in ("rounds", "clients")}

