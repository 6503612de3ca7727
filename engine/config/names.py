"""The names config validation checks ``model.name`` and ``dataset.name`` against, importable
without torch and below the data and models layers (they import config, not the other way round).
:data:`engine.models.zoo.MODELS` and :data:`engine.data.datasets.DATASETS` have exactly these keys
(checked when they are imported)."""

MODEL_NAMES: tuple[str, ...] = ("cnn", "lenet5", "lenet5_half", "cifar_cnn", "resnet18", "mlp")

# register_dataset adds a user's dataset here too, so that configs naming it validate
DATASET_NAMES: set[str] = {
    "digits", "mnist5k", "synthetic", "fashion_mnist", "mnist", "fashion_mnist_tv", "emnist", "cifar10",
    "cifar100", "parquet", "leaf",
}
