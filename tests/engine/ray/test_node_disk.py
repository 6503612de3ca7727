"""engine.ray.node_disk on one local Ray: a folder keeps its token and actor name, so the handlers
Tune saved with a sweep's trials still work when the sweep is resumed; another driver's actor
holding the name refuses the folder. On a real two-node cluster: tests/engine/ray/test_cluster.py."""
import pickle

import pytest

from engine.ray.node_disk import MARKER, NodeDiskHandler, StorageActorGone, StorageInUseError, node_disk_filesystem

pytestmark = pytest.mark.ray


def _handler(fs) -> NodeDiskHandler:
    return fs.handler


def test_a_folder_keeps_its_token_and_the_handlers_saved_before_still_reach_it(tmp_path, ray_session):
    first = _handler(node_disk_filesystem(tmp_path / "sw"))
    saved = pickle.dumps(first)  # as in Tune's experiment state
    second = _handler(node_disk_filesystem(tmp_path / "sw"))  # a resume in this driver: its actor reused
    assert (second.token, second.actor_name) == (first.token, first.actor_name)
    assert (tmp_path / "sw" / MARKER).read_text() == first.token + "\n"
    old = pickle.loads(saved)
    assert old.is_local()
    (tmp_path / "sw" / "a.txt").write_text("x")
    # the others go through the actor: the same name finds this driver's actor
    old._local = False
    assert [(t, s) for t, s, _ in old._call("file_info", [str(tmp_path / "sw" / "a.txt")])] == [(2, 1)]
    other = _handler(node_disk_filesystem(tmp_path / "other"))
    assert other.token != first.token and other.actor_name != first.actor_name


def test_a_damaged_marker_gets_a_new_token(tmp_path, ray_session):
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / MARKER).write_text("not a token\n")
    token = _handler(node_disk_filesystem(tmp_path / "sw")).token
    assert len(token) == 32 and (tmp_path / "sw" / MARKER).read_text() == token + "\n"


def test_a_folder_served_by_another_driver_is_refused(tmp_path, ray_session):
    import ray

    from engine.ray.node_disk import _node_disk_actor_class  # the actor as another driver starts it

    token = "ab" * 16
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / MARKER).write_text(token + "\n")
    name = f"hetsim-storage-{token[:16]}"
    theirs = _node_disk_actor_class().options(name=name, namespace="hetsim").remote("another-job")
    try:
        ray.get(theirs.ready.remote())
        with pytest.raises(StorageInUseError, match=r"storage .*/sw is in use by another driver .*another-job"):
            node_disk_filesystem(tmp_path / "sw", holder_wait_s=1.0)
    finally:
        ray.kill(theirs)


def test_a_handler_whose_actor_is_gone_says_how_to_resume(tmp_path, ray_session):
    gone = NodeDiskHandler("hetsim-storage-0000000000000000", "hetsim", str(tmp_path / "elsewhere"), "0" * 32)
    with pytest.raises(StorageActorGone, match=r"actor hetsim-storage-0+ is gone .*hetsim sweep --resume"):
        gone.get_file_info([str(tmp_path / "elsewhere" / "x")])
