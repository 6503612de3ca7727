"""Tests for engine/models/zoo.py (fast: CPU only, a few seconds)."""
import copy

import pytest
import torch
import torch.nn as nn
import torchvision
from torch.utils.flop_counter import FlopCounterMode

from algorithms.training import flat_params as get_flat_params
from algorithms.training import load_flat_params as set_flat_params
from algorithms.training import num_params as num_flat_params
from engine.models.flops import training_flops_per_sample
from engine.models.zoo import (
    DEFAULT_INPUT_SHAPES,
    MODELS,
    build_model,
    count_parameters,
)

# (name, input_shape, params) combos every model must accept
ACCEPTED = [
    ("cnn", (1, 28, 28), {}),
    ("cnn", (3, 32, 32), {}),
    ("lenet5", (1, 32, 32), {}),
    ("lenet5", (1, 28, 28), {}),
    ("lenet5", (3, 32, 32), {}),
    ("lenet5_half", (1, 32, 32), {}),
    ("lenet5_half", (1, 28, 28), {}),
    ("cifar_cnn", (3, 32, 32), {}),
    ("cifar_cnn", (1, 28, 28), {}),
    ("resnet18", (3, 32, 32), {}),
    ("resnet18", (1, 28, 28), {}),
    ("mlp", (60,), {"hidden": []}),
    ("mlp", (64,), {}),
    ("mlp", (64,), {"hidden": [32, 16]}),
    ("mlp", (1, 28, 28), {"hidden": [100]}),
]

REJECTED = [
    ("cnn", (60,)),
    ("cnn", (1, 8, 8)),
    ("cnn", (28, 28)),
    ("lenet5", (1, 30, 30)),
    ("lenet5", (1, 64, 64)),
    ("lenet5", (64,)),
    ("lenet5_half", (3, 24, 24)),
    ("cifar_cnn", (3, 4, 4)),
    ("cifar_cnn", (32, 32)),
    ("resnet18", (60,)),
    ("resnet18", (3, 4, 4)),
    ("mlp", ()),
    ("mlp", (0,)),
]


def test_registry_complete():
    assert set(MODELS) == {"cnn", "lenet5", "lenet5_half", "cifar_cnn", "resnet18", "mlp", "fmnist_cnn"}
    assert set(DEFAULT_INPUT_SHAPES) == set(MODELS)
    for name, builder in MODELS.items():
        assert builder.__doc__ and "input" in builder.__doc__.lower(), name


def test_unknown_model_lists_known_names():
    with pytest.raises(ValueError) as exc:
        build_model("vgg99", (3, 32, 32), 10)
    msg = str(exc.value)
    assert "vgg99" in msg
    for name in MODELS:
        assert name in msg


@pytest.mark.parametrize("shape", [(1, 32, 32), (1, 28, 28)])
def test_lenet_exact_param_counts(shape):
    assert count_parameters(build_model("lenet5", shape, 10)) == 61_706
    assert count_parameters(build_model("lenet5_half", shape, 10)) == 15_738


def test_resnet18_param_count_and_torchvision_layout():
    model = build_model("resnet18", (3, 32, 32), 10)
    n = count_parameters(model)
    assert n == 11_173_962
    assert abs(n - 11.17e6) < 0.01e6
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    ref = torchvision.models.resnet18(weights=None, num_classes=10)
    ref.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    ref.maxpool = nn.Identity()
    ref_shapes = {k: v.shape for k, v in ref.state_dict().items()}
    assert {k: v.shape for k, v in model.state_dict().items()} == ref_shapes


def test_other_param_counts():
    # cnn: 156 + 2416 + 256*120+120 + 120*84+84 + 84*10+10
    assert count_parameters(build_model("cnn", (1, 28, 28), 10)) == 44_426
    assert count_parameters(build_model("mlp", (60,), 10, hidden=[])) == 60 * 10 + 10
    assert count_parameters(build_model("mlp", (64,), 10)) == 64 * 64 + 64 + 64 * 10 + 10


@pytest.mark.parametrize("name,shape,params", ACCEPTED)
def test_forward_shape(name, shape, params):
    torch.manual_seed(0)
    num_classes = 7
    model = build_model(name, shape, num_classes, **params)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(3, *shape))
    assert out.shape == (3, num_classes)
    assert torch.isfinite(out).all()
    assert model.input_shape == tuple(shape)


@pytest.mark.parametrize("name,shape", REJECTED)
def test_bad_shape_raises(name, shape):
    with pytest.raises(ValueError) as exc:
        build_model(name, shape, 10)
    msg = str(exc.value)
    assert name in msg
    assert str(tuple(shape)) in msg
    assert "accepts" in msg


def test_bad_num_classes():
    with pytest.raises(ValueError):
        build_model("cnn", (1, 28, 28), 0)


def _forward_flops(name, shape, num_classes, batch=2, **params):
    torch.manual_seed(0)
    model = build_model(name, shape, num_classes, **params)
    model.train()
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(batch, *shape))
    return counter.get_total_flops() // batch


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_flops_about_3x_forward(name):
    shape = DEFAULT_INPUT_SHAPES[name]
    train = training_flops_per_sample(name, shape, 10)
    fwd = _forward_flops(name, shape, 10)
    assert isinstance(train, int) and train > 0
    ratio = train / fwd
    # backward = 2x forward except the first layer, which needs no grad w.r.t.
    # the data input: ratio is in [2, 3], close to 3 for deep nets.
    assert 2.0 <= ratio <= 3.0 + 1e-9, ratio
    if name in ("cnn", "lenet5", "lenet5_half", "cifar_cnn"):
        assert ratio > 2.5, ratio
    if name == "resnet18":
        assert ratio == pytest.approx(3.0, rel=0.01)


def test_logistic_regression_flops_exact():
    # one Linear 60->10: forward 2*60*10, backward only grad-weight (input needs no grad)
    assert training_flops_per_sample("mlp", (60,), 10, hidden=[]) == 2 * 2 * 60 * 10


def test_flops_ordering():
    lenet = training_flops_per_sample("lenet5", (1, 32, 32), 10)
    half = training_flops_per_sample("lenet5_half", (1, 32, 32), 10)
    cnn = training_flops_per_sample("cnn", (1, 28, 28), 10)
    resnet = training_flops_per_sample("resnet18", (3, 32, 32), 10)
    assert lenet > half > 0
    assert resnet > 100 * cnn


def test_flops_cache_and_rng_untouched():
    training_flops_per_sample.cache_clear()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = training_flops_per_sample("mlp", (64,), 10, hidden=[32, 16])
    assert torch.equal(torch.random.get_rng_state(), before)  # global RNG not consumed
    info = training_flops_per_sample.cache_info()
    b = training_flops_per_sample("mlp", [64], 10, hidden=(32, 16))  # equivalent key
    assert a == b
    assert training_flops_per_sample.cache_info().hits == info.hits + 1
    assert training_flops_per_sample("mlp", (64,), 10, hidden=[32]) != a


def test_flops_of_builtin_models_are_kept_on_disk(tmp_path, monkeypatch):
    import engine.models.flops as flops

    monkeypatch.setenv("HETSIM_CACHE_DIR", str(tmp_path))
    training_flops_per_sample.cache_clear()
    counted = training_flops_per_sample("mlp", (64,), 10, hidden=[32, 16])
    (stored,) = tmp_path.glob("training_flops-*.json")
    # a new process (per-process memo cleared) reads the count instead of counting
    training_flops_per_sample.cache_clear()
    monkeypatch.setattr(flops, "_count_training_flops", lambda *a: pytest.fail("counted again"))
    assert training_flops_per_sample("mlp", (64,), 10, hidden=(32, 16)) == counted
    # another key (params, shape, classes) is counted; so is an unreadable cache
    for call in (lambda: training_flops_per_sample("mlp", (64,), 10, hidden=[8]),
                 lambda: training_flops_per_sample("mlp", (64,), 3, hidden=[32, 16])):
        with pytest.raises(pytest.fail.Exception, match="counted again"):
            call()
    stored.write_text("{not json")
    training_flops_per_sample.cache_clear()
    with pytest.raises(pytest.fail.Exception, match="counted again"):
        training_flops_per_sample("mlp", (64,), 10, hidden=[32, 16])


def test_flops_of_a_model_not_built_in_are_not_kept_on_disk(tmp_path, monkeypatch):
    from engine.plugins import register_model, unregister

    monkeypatch.setenv("HETSIM_CACHE_DIR", str(tmp_path))
    register_model("logreg_test", lambda input_shape, num_classes: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(input_shape[0], num_classes)))
    training_flops_per_sample.cache_clear()
    try:
        assert training_flops_per_sample("logreg_test", (64,), 10) == 3 * 64 * 10 * 2 - 64 * 10 * 2
        assert not list(tmp_path.glob("training_flops-*.json"))
    finally:
        training_flops_per_sample.cache_clear()
        unregister("model", "logreg_test")


@pytest.mark.parametrize("name", ["cnn", "lenet5_half", "resnet18", "mlp"])
def test_flat_params_roundtrip(name):
    torch.manual_seed(0)
    model = build_model(name, DEFAULT_INPUT_SHAPES[name], 10)
    flat = get_flat_params(model)
    assert flat.dtype == torch.float32 and flat.dim() == 1
    assert flat.numel() == num_flat_params(model) == count_parameters(model)
    # order matches named_parameters()
    expected = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
    assert torch.equal(flat, expected)
    # returned vector is a copy
    flat[0] += 1.0
    assert not torch.equal(flat, get_flat_params(model))

    new = torch.arange(flat.numel(), dtype=torch.float32) / flat.numel()
    params_before = [id(p) for p in model.parameters()]
    set_flat_params(model, new)
    assert [id(p) for p in model.parameters()] == params_before
    assert torch.equal(get_flat_params(model), new)
    new.zero_()  # no aliasing
    assert not torch.equal(get_flat_params(model), new)
    assert all(not p.grad_fn for p in model.parameters())


def test_set_flat_params_wrong_size():
    model = build_model("mlp", (60,), 10, hidden=[])
    with pytest.raises(ValueError):
        set_flat_params(model, torch.zeros(num_flat_params(model) + 1))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_determinism(name):
    shape = DEFAULT_INPUT_SHAPES[name]
    torch.manual_seed(0)
    a = get_flat_params(build_model(name, shape, 10))
    torch.manual_seed(0)
    b = get_flat_params(build_model(name, shape, 10))
    assert torch.equal(a, b)


# --------------------------------------------------------------------------- #
# MaxPool2d: the strided-view forward without autograd equals the native kernel
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("shape", [(16, 6, 28, 28), (4, 16, 10, 10), (3, 2, 7, 9), (2, 5, 3, 2)])
def test_fast_maxpool_equals_native_bit_for_bit(shape):
    from engine.models.zoo import MaxPool2d

    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(*shape, generator=g)).round()  # many ties, zeros and equal values
    x[0, 0, 0, 0] = float("nan")
    x[-1, -1, -1, -1] = float("inf")
    with torch.no_grad():
        fast = MaxPool2d()(x)
        native = torch.nn.functional.max_pool2d(x, 2)
    assert fast.shape == native.shape
    assert torch.equal(fast.nan_to_num(-7.0), native.nan_to_num(-7.0))
    assert torch.equal(fast.isnan(), native.isnan())


def test_fast_maxpool_refuses_what_the_native_kernel_refuses():
    from engine.models.zoo import MaxPool2d

    with torch.no_grad(), pytest.raises(RuntimeError, match="too small"):
        MaxPool2d()(torch.zeros(2, 5, 1, 4))


def test_fast_maxpool_leaves_training_to_the_native_kernel():
    from engine.models.zoo import MaxPool2d

    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    MaxPool2d()(x).square().sum().backward()
    torch.nn.functional.max_pool2d(x2, 2).square().sum().backward()
    assert torch.equal(x.grad, x2.grad)


@pytest.mark.parametrize("name,shape", [("lenet5", (1, 28, 28)), ("cnn", (1, 28, 28)), ("cifar_cnn", (3, 32, 32))])
def test_models_evaluate_exactly_as_with_native_pooling(name, shape):
    """Evaluation logits of the built-in models equal those of the same model with
    ``nn.MaxPool2d(2)`` put back: the fast pooling changes no result."""
    from engine.models.zoo import MaxPool2d

    torch.manual_seed(0)
    model = build_model(name, shape, 10).eval()
    reference = copy.deepcopy(model)
    for parent in reference.modules():
        for key, child in parent.named_children():
            if isinstance(child, MaxPool2d):
                setattr(parent, key, torch.nn.MaxPool2d(2))
    x = torch.randn(8, *shape)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))
