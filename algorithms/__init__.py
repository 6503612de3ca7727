"""Federated-learning methods as plain PyTorch/numpy code: no Ray, no file I/O.

``ALGORITHMS`` maps a method's config name to its :class:`~algorithms.base.AlgorithmSpec`.
"""
from algorithms.base import AlgorithmSpec
from algorithms import ascend, compressed_fedavg, fedcspack
from algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer, FedProxParams

ALGORITHMS: dict[str, AlgorithmSpec] = {
    "fedavg": AlgorithmSpec("fedavg", FedAvgParams, FedAvgClient, FedAvgServer, "FedAvg"),
    "fedprox": AlgorithmSpec("fedprox", FedProxParams, FedAvgClient, FedAvgServer, "FedProx (mu)"),
    "fedavg_compressed": compressed_fedavg.SPEC,
    "fedcspack": fedcspack.SPEC,
    "ascend": ascend.SPEC,
}
