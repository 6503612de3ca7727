"""What more than one test module uses: the repository's root, one torch thread, and the
modules beside this file (one per package whose tests share a tiny experiment or a tool).

Importable as ``helpers`` from every folder of tests/ (``pythonpath = tests`` in setup.cfg), so a
test module never imports another test module nor counts how deep its own folder is.
"""
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # tests/helpers/ -> the repository


@contextmanager
def one_torch_thread():
    """Like a 1-CPU trial (and faster here: two threads on two busy cores make this tiny MLP
    ~10x slower; the results are the same)."""
    import torch  # deferred: most test modules that import helpers never train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
