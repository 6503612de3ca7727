"""The wire formats methods give ``clock.mode: timing_only`` (Server.timing_payload): each equals
what the method's own code sends. End to end (a timing-only run equals the full run's clock
columns): tests/engine/test_timing_only.py."""
import numpy as np
import pytest
import torch

from algorithms.base import ArchShape, TimingUnsupported
from algorithms.compressed_fedavg import CompressedFedAvgServer, buffer_upload, compressed_payload, compressed_upload
from algorithms.compressors import COMPRESSORS, compress, resolve_k
from algorithms.fedavg import FedAvgServer
from algorithms.fedcspack import FedCSPACKServer, download_nbytes, num_packs, upload_nbytes
from algorithms.params import CompressedFedAvgParams, FedAvgParams, FedCSPACKParams
from algorithms.training import batch_schedule, flat_buffers, local_samples, num_params


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
@pytest.mark.parametrize(("d", "k"), [(1, 1), (100, 7), (513, 0.25), (1000, 1000), (2048, 0.01)])
def test_a_compressors_size_rule_is_the_payload_it_builds(name, d, k):
    a = torch.from_numpy(np.random.default_rng(d).standard_normal(d).astype(np.float32))
    c = compress(name, a, k, seed=3, round=5)
    kk = resolve_k(k, d) if COMPRESSORS[name].uses_k else d
    assert COMPRESSORS[name].wire_nbytes(d, kk) == c.nbytes == sum(x.nbytes for x in c.to_arrays().values())


@pytest.mark.parametrize("n", [0, 1, 7, 16, 17, 100])
@pytest.mark.parametrize(("epochs", "steps"), [(1, None), (3, None), (1, 1), (1, 5), (1, 13)])
def test_local_samples_counts_the_batches_local_sgd_trains_on(n, epochs, steps):
    batches = batch_schedule(np.random.default_rng(0), n, 16, epochs, steps)
    assert int(local_samples([n], 16, epochs, steps)[0]) == sum(len(b) for b in batches)


def _bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.BatchNorm1d(10), torch.nn.Linear(10, 3))


@pytest.mark.parametrize("buffers", ["dense", "local"])
def test_a_compressed_upload_counts_the_dense_buffers_it_carries(buffers):
    model = _bn_model()
    shape = ArchShape(num_params(model), int(flat_buffers(model).numel()))
    assert shape.buffers == 20  # BatchNorm1d(10): mean and var (its batch count is an integer)
    delta = torch.randn(shape.parameters)
    c = compress("topk", delta, 0.1)
    sent = compressed_payload(c, buffer_upload(model, buffers, {}))
    nbytes, ops = compressed_upload("topk", 0.1, False, {}, shape, buffers)
    assert (nbytes, ops) == (sent.nbytes, c.ops)


def test_fedavg_and_compressed_fedavg_download_the_full_state():
    shapes = {"": ArchShape(100, 20)}
    fedavg = FedAvgServer.timing_payload(FedAvgParams(), shapes)
    assert fedavg.download_bytes("") == 480 and fedavg.upload_bytes("") == (480, 0.0)
    params = CompressedFedAvgParams(compressor="randomk", k=10, op_costs={"randomk_per_index": 3.0})
    rule = CompressedFedAvgServer.timing_payload(params, shapes)
    assert rule.download_bytes("") == 480 and rule.upload_bytes("") == (4 * 10 + 8 + 4 * 20, 30.0)


def test_fedcspack_shares_every_pack_with_sharing_full_and_its_mask_follows_the_steps():
    shapes = {"a": ArchShape(100), "b": ArchShape(50)}
    rule = FedCSPACKServer.timing_payload(FedCSPACKParams(sharing="full", pack_size=32), shapes)
    j = num_packs(100, 32)
    assert rule.upload_bytes("a") == (upload_nbytes(j, j, 32), 0.0)
    assert rule.download_bytes("a") == download_nbytes(100, j, 0)  # round 0: an empty global mask
    rule.stepped({"a"}, synchronous=True)
    assert rule.download_bytes("a") == download_nbytes(100, j, j) and rule.download_bytes("b") == download_nbytes(
        50, 2, 0)
    rule.stepped({"b"}, synchronous=False)  # an asynchronous step keeps the masks it does not touch
    assert rule.state() == {"a": j, "b": 2}
    rule.stepped({"b"}, synchronous=True)  # a round without uploads of "a" empties its mask
    assert rule.state() == {"a": 0, "b": 2}


def test_fedcspack_sharing_packs_is_refused_with_the_reason():
    with pytest.raises(TimingUnsupported, match="depend on training; sharing: full has a fixed payload"):
        FedCSPACKServer.timing_payload(FedCSPACKParams(k=3), {"": ArchShape(100)})
