"""The checkpoint codec: every supported type comes back exactly, anything else fails loudly."""
import io
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from algorithms.bandits import EpsilonGreedyEMA, Exp3, FixedArm
from algorithms.state import StateCodecError, checkpointable, decode, encode
from engine.clients.format import load_blob, load_client_states, save_blob, save_client_states


def roundtrip(value):
    """Through JSON text and torch.save / torch.load(weights_only=True), as a checkpoint does."""
    buf = io.BytesIO()
    save_blob(value, buf)
    return load_blob(buf.getvalue())


def same(a, b):
    """Equal values of exactly the same types, recursively (NaN equal to NaN, -0.0 kept)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert a.numpy(force=True).tobytes() == b.numpy(force=True).tobytes() if a.dtype != torch.bfloat16 \
            else torch.equal(a.view(torch.int16), b.view(torch.int16))  # bit-exact
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, np.random.Generator):
        same(a.bit_generator.state, b.bit_generator.state)
    else:
        assert a == b


def test_every_supported_type_round_trips_exactly():
    gen = np.random.default_rng([1, 2, 3])
    gen.random(5)
    value = {
        "none": None, "true": True, "int": -(2**70), "float": 0.1, "neg_zero": -0.0,
        "nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"), "str": "$not-a-tag",
        "bytes": b"\x00\xff",
        "f32": torch.randn(3, 4), "f16": torch.randn(5).half(), "bf16": torch.randn(2).bfloat16(),
        "i64": torch.arange(7), "bool_t": torch.tensor([True, False]), "scalar_t": torch.tensor(3.5),
        "empty_t": torch.zeros(0, 3),
        "np_f32": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
        "np_f64_0d": np.array(2.5), "np_u16": np.arange(5, dtype=np.uint16), "np_bool": np.array([True]),
        "np_fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "np_empty": np.zeros((0,), np.int8),
        "np_big_endian": np.arange(3, dtype=">i4"),
        "np_struct": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
        "np_scalars": [np.float32(1.1), np.float64(-0.0), np.int64(-5), np.bool_(True), np.uint8(255)],
        "gen": gen, "mt": np.random.Generator(np.random.MT19937(7)),
        "tuple": (1, (2.0, "x")), "set": {1, 2, 3}, "frozenset": frozenset({"a"}),
        "int_keys": {3: "three", -1: [1, 2]}, "tuple_keys": {(1, "a"): 1.5},
        "dollar_key": {"$t": 1}, "odict": OrderedDict([("b", 1), ("a", 2)]),
        "nested": [{"x": [torch.ones(2), np.ones(2)]}],
        # above INLINE_BYTES: stored as tensors in the file rather than inline in the JSON
        "big_t": torch.randn(3, 500), "big_bf16": torch.randn(2000).bfloat16(),
        "big_np": np.random.default_rng(0).normal(size=(40, 30)).astype(np.float32),
        "big_np_struct": np.zeros(300, dtype=[("a", "<i4"), ("b", "<f8")]),
    }
    back = roundtrip(value)
    same(value, back)
    # the generators continue identically
    assert back["gen"].random() == gen.random()
    # restored arrays are writable (clients update residuals in place)
    assert back["np_f32"].flags.writeable and back["big_np"].flags.writeable


def test_bandit_policies_round_trip_and_continue_identically():
    eg = EpsilonGreedyEMA(["topk", "randomk", "periodick"], warmup=1)
    ex = Exp3(["topk", "randomk"])
    rng = np.random.default_rng(0)
    for _ in range(5):
        arm, _ = eg.choose(rng)
        eg.update(arm, float(rng.normal()))
        arm, _ = ex.choose(rng)
    state = {"policy": eg, "exp3": ex, "fixed": FixedArm("topk", updates=3)}
    back = roundtrip(state)
    assert type(back["policy"]) is EpsilonGreedyEMA and type(back["exp3"]) is Exp3
    assert back["exp3"].pending_p == ex.pending_p and back["fixed"].updates == 3
    r1, r2 = np.random.default_rng(9), np.random.default_rng(9)
    for _ in range(20):
        a1, a2 = eg.choose(r1), back["policy"].choose(r2)
        assert a1 == a2
        eg.update(a1[0], 0.3)
        back["policy"].update(a2[0], 0.3)
        assert ex.choose(r1) == back["exp3"].choose(r2)
    assert np.array_equal(eg.q, back["policy"].q)


def test_shared_objects_stay_shared_and_cycles_survive():
    arr = np.arange(4.0)
    t = torch.ones(3)
    inner = [1]
    value = {"a": arr, "b": arr, "t1": t, "t2": t, "l1": inner, "l2": inner}
    value["self"] = value
    back = roundtrip(value)
    assert back["a"] is back["b"] and back["t1"] is back["t2"] and back["l1"] is back["l2"]
    assert back["self"] is back


def test_a_view_is_saved_without_its_base():
    base = torch.zeros(1_000_000)
    buf = io.BytesIO()
    save_blob({"view": base[:10]}, buf)
    assert buf.tell() < 10_000


@dataclass
class Unregistered:
    x: int = 0


@checkpointable
@dataclass
class Registered:
    x: int = 0
    y: list = field(default_factory=list)


class Plain:
    pass


@pytest.mark.parametrize("value, where, what", [
    ({"policy": Unregistered()}, r"state\['policy'\]", "Unregistered is not registered"),
    ({"a": [1, Plain()]}, r"state\['a'\]\[1\]", "type .*Plain is not supported"),
    ({"a": np.array([object()])}, r"state\['a'\]", "dtype object"),
    ({"r": Registered(y=[lambda: 0])}, r"state\['r'\]\.y\[0\]", "function is not supported"),
])
def test_unsupported_values_fail_naming_the_path_and_type(value, where, what):
    with pytest.raises(StateCodecError, match=f"{where}.*{what}"):
        encode(value, [])


def test_a_registered_dataclass_with_extra_attributes_fails_loudly():
    r = Registered()
    r.sneaky = 1
    with pytest.raises(StateCodecError, match="not dataclass fields: \\['sneaky'\\]"):
        encode(r, [])


def test_decoding_a_dataclass_whose_fields_changed_fails_loudly():
    tensors = []
    tree = encode(Registered(1, [2]), tensors)
    body = json.loads(json.dumps(tree))
    del body["$dc"][1]["y"]
    with pytest.raises(StateCodecError, match="fields \\['x'\\], the class now has \\['x', 'y'\\]"):
        decode(body, tensors)


def test_client_shard_names_the_client_and_loads_only_the_owned_ones(tmp_path):
    states = {c: {"v": torch.full((3,), float(c)), "n": np.int64(c)} for c in range(10)}
    info = save_client_states(states, tmp_path / "s.pt")
    assert info["clients"] == 10 and info["bytes"] == (tmp_path / "s.pt").stat().st_size
    odd = load_client_states([tmp_path / "s.pt"], lambda c: c % 2 == 1)
    assert list(odd) == [1, 3, 5, 7, 9]
    same(odd[7], states[7])
    with pytest.raises(StateCodecError, match=r"client 4 state\['bad'\]"):
        save_client_states({4: {"bad": Plain()}}, tmp_path / "bad.pt")


def test_files_are_loaded_with_weights_only(tmp_path, monkeypatch):
    """A checkpoint file never unpickles code: torch.load is always called with weights_only."""
    calls = []
    real = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    save_blob({"x": 1}, tmp_path / "a.pt")
    load_blob(tmp_path / "a.pt")
    torch.save({"format": "hetsim-state/1", "meta": "{}", "tensors": [], "evil": Plain()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="(?i)weights.only|Unsupported global"):
        load_blob(tmp_path / "evil.pt")
    assert calls and all(c is True for c in calls)
