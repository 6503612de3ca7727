"""Object storage is bounded in time: every remote operation ends within HETSIM_STORAGE_TIMEOUT_S
(an endpoint that refuses, or one that accepts and never answers), and its error names the URI,
the filesystem and the likely cause. Tested against moto's local S3 server and an unreachable
gs:// endpoint."""
import datetime as dt
import socket
import tempfile
import time

import pytest

from engine.errors import ConfigError
from engine.storage.locations import StorageUnreachable, check_writable, open_storage
from hetsim.cli import main

TINY = ["dataset.name=digits", "model.name=mlp", "rounds=1", "clients.num_clients=6"]
LIMIT_S = 2.0


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    monkeypatch.setenv("HETSIM_STORAGE_TIMEOUT_S", str(LIMIT_S))
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def moto_endpoint():
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connections are refused
    return port


@pytest.fixture
def black_hole():
    s = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


def _s3(endpoint: str) -> dict:
    return {"endpoint_override": endpoint, "access_key": "testing", "secret_key": "testing"}


def _gs_uri(port: int, path: str = "bkt/runs/r") -> str:
    return f"gs://{path}?endpoint_override=127.0.0.1:{port}&scheme=http&anonymous=true"


def test_moto_s3_works_within_the_bounds(moto_endpoint):
    store = open_storage("s3://hetsim-test/runs/x", {**_s3(moto_endpoint), "allow_bucket_creation": True})
    t0 = time.monotonic()
    check_writable(store)
    store.write_text("a/b.txt", "hello")
    assert store.files() == ["a/b.txt"] and store.read_text("a/b.txt") == "hello"
    assert store.exists("a") and not store.exists("nothing")
    store.delete("a")
    assert store.files() == []
    assert time.monotonic() - t0 < LIMIT_S * 5
    with pytest.raises(FileNotFoundError):  # a missing file stays a missing file (readers rely on it)
        store.read_text("a/b.txt")


@pytest.mark.parametrize("kind", ["refused", "silent"])
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_unreachable_endpoint_ends_show_within_the_bound_and_says_why(kind, scheme, closed_port, black_hole,
                                                                           capsys):
    port = closed_port if kind == "refused" else black_hole
    uri = _gs_uri(port) if scheme == "gs" else f"s3://bkt/runs/r?endpoint_override=http://127.0.0.1:{port}"
    t0 = time.monotonic()
    assert main(["show", uri]) == 2
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    fs = "GcsFileSystem" if scheme == "gs" else "S3FileSystem"
    assert f"storage {scheme}://bkt/runs/r (pyarrow.fs.{fs}): looking up 'bkt/runs/r/manifest.json'" in err
    assert "likely cause: the network" in err and f"127.0.0.1:{port}" in err
    assert "This is a bug" not in err and "Traceback" not in err
    if kind == "silent":
        assert f"did not answer within {LIMIT_S:g} s (the bound HETSIM_STORAGE_TIMEOUT_S={LIMIT_S:g})" in err
    assert took < LIMIT_S + 2.0, took


def test_a_run_into_unreachable_gs_storage_fails_at_once_and_writes_nothing(tmp_path, monkeypatch, black_hole,
                                                                             capsys):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where a staging folder would go
    monkeypatch.setattr(tempfile, "tempdir", None)  # (tempfile caches it)
    t0 = time.monotonic()
    assert main(["run", "-q", "-o", _gs_uri(black_hole), *(a for s in TINY for a in ("--set", s))]) == 2
    assert time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert "storage gs://bkt/runs/r (pyarrow.fs.GcsFileSystem): creating 'bkt/runs/r' did not answer" in err
    assert list(tmp_path.iterdir()) == []


def test_timeouts_are_configurable(monkeypatch):
    store = open_storage("s3://bkt/x", {"endpoint_override": "http://127.0.0.1:9"})
    assert store.watchdog_s == LIMIT_S and store.options == {"endpoint_override": "http://127.0.0.1:9",
                                                              "region": "us-east-1"}
    slow = open_storage("s3://bkt/x", {"endpoint_override": "http://127.0.0.1:9", "request_timeout": 30})
    assert slow.watchdog_s == 60  # a longer time-out of the filesystem's own is not cut short
    gcs = open_storage("gs://bkt/x", {"retry_time_limit": 4, "anonymous": True})
    assert gcs.watchdog_s == 8 and gcs.options["retry_time_limit"] == 4
    assert open_storage("gs://bkt/x", {"retry_time_limit": dt.timedelta(seconds=1)}).watchdog_s == LIMIT_S
    monkeypatch.setenv("HETSIM_STORAGE_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match=r"HETSIM_STORAGE_TIMEOUT_S = 'soon': give a number of seconds > 0"):
        open_storage("s3://bkt/x")
    assert issubclass(StorageUnreachable, OSError)  # callers that handle I/O errors still do
