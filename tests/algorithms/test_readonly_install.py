"""The numba kernel compiles on a read-only install with no writable home (a locked-down
container or Ray worker node): its cache falls back to a private temporary folder, or to none."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PACKAGES = ("algorithms", "engine", "hardware_profiles")
CHECK = """
import numpy as np, torch
import algorithms  # imports the kernel module, which compiles with cache=True
from algorithms.pack_kernel import pack_sums
rng = np.random.default_rng(0)
l = rng.normal(size=(7, 33)).astype(np.float32); g = rng.normal(size=(7, 33)).astype(np.float32)
got = pack_sums(torch.from_numpy(l), torch.from_numpy(g)).numpy().astype(np.float64)
L, G = torch.from_numpy(l).double(), torch.from_numpy(g).double()
lg, ll = torch.log_softmax(G, 1), torch.log_softmax(L, 1)
want = torch.stack([(L * G).sum(1), (L * L).sum(1), (G * G).sum(1), (lg.exp() * (lg - ll)).sum(1)])
assert np.allclose(got, want.numpy(), rtol=1e-6, atol=0), (got, want)
import algorithms.pack_kernel as kernel
print("KERNEL OK; cache:", getattr(kernel._pack_sums._cache, "_cache_path", None))
"""


def _can_bind_read_only() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", 'd=$(mktemp -d) && mount --bind "$d" "$d" '
                            '&& mount -o remount,ro,bind "$d" && ! touch "$d/x" 2>/dev/null'],
                           capture_output=True)
    return probe.returncode == 0


def _run_read_only(tmp_path: Path, readonly: list[Path], env: dict) -> subprocess.CompletedProcess:
    """Run CHECK with ``readonly`` folders unwritable: read-only bind mounts as root (root ignores
    file modes), file modes otherwise."""
    cmd = [sys.executable, "-c", CHECK]
    if os.geteuid() == 0:
        mounts = " && ".join(f"mount --bind {p} {p} && mount -o remount,ro,bind {p}" for p in readonly)
        script = tmp_path / "run.sh"
        # (from tmp_path: `python -c` puts the current folder first on sys.path)
        script.write_text(f"cd {tmp_path} && {mounts} && exec env -i " + " ".join(f"{k}={v}" for k, v in env.items())
                          + " " + " ".join(f"'{c}'" for c in cmd) + "\n")
        return subprocess.run(["unshare", "-m", "sh", str(script)], capture_output=True, text=True,
                              timeout=300)
    for p in readonly:
        subprocess.run(["chmod", "-R", "a-w", str(p)], check=True)
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        for p in readonly:
            subprocess.run(["chmod", "-R", "u+w", str(p)], check=True)


@pytest.fixture
def install(tmp_path):
    if os.geteuid() == 0 and not _can_bind_read_only():
        pytest.skip("running as root without mount namespaces: cannot make a folder read-only")
    pkg, home, tmp = tmp_path / "site", tmp_path / "home", tmp_path / "tmp"
    for name in PACKAGES:
        shutil.copytree(REPO / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__"))
    home.mkdir()
    tmp.mkdir()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(pkg), "TMPDIR": str(tmp),
           "PYTHONDONTWRITEBYTECODE": "1"}
    return pkg, home, tmp, env


def test_kernel_caches_in_a_private_temp_folder_when_install_and_home_are_read_only(tmp_path, install):
    pkg, home, tmp, env = install
    out = _run_read_only(tmp_path, [pkg, home], env)
    assert "KERNEL OK" in out.stdout, out.stderr[-3000:]
    cache = tmp / f"hetsim-numba-{os.getuid()}"
    assert f"cache: {cache}" in out.stdout, out.stdout
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o700
    assert list(cache.rglob("*.nbi")), "the compiled kernel is cached there for later processes"
    assert not list(pkg.rglob("*.nbi")) and not list(home.rglob("*"))


def test_kernel_compiles_without_any_writable_cache_folder(tmp_path, install):
    pkg, home, tmp, env = install
    out = _run_read_only(tmp_path, [pkg, home, tmp], env)
    assert "KERNEL OK" in out.stdout, out.stderr[-3000:]
