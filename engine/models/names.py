"""The built-in models' names, importable without torch: config validation checks
``model.name`` against them. :data:`engine.models.zoo.MODELS` has exactly these keys (checked when
it is imported)."""

MODEL_NAMES: tuple[str, ...] = ("cnn", "lenet5", "lenet5_half", "cifar_cnn", "resnet18", "mlp")
