"""User code in every process of a run: the config's ``plugins:``, and what a session registered.

A ``plugins:`` entry is a module name (installed, or on ``PYTHONPATH``) or a path, relative to the
config file like every path of a config: a ``.py`` file, a package folder (with ``__init__.py``),
or a plain folder whose ``.py`` files are each imported. Importing one runs its registrations
(:mod:`engine.plugins`). Every process that runs a part of an experiment imports the same
plugins: the command line when it loads the config, and a Ray driver actor, client actor or Tune
trial when it receives the config. A path's files travel inside the pickled config
(:mod:`engine.plugin_transport`), so a cluster node without the files (its own disk) writes them
into its temporary folder, keyed by their digest, and imports them from there; a node that has
them, unchanged, imports them in place (tracebacks then name the user's own files).

Why not Ray's ``runtime_env`` (``py_modules``)? A job-level environment cannot be set on a Ray the
user already started (a notebook, the tests' shared Ray), Tune's trial actors take no per-trial
environment, and Ray unpickles an actor's arguments (the config) before any code of ours runs in
it; carrying the files inside the config reaches every such process by one mechanism.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from algorithms.registry import REGISTRIES, Origin, loading_from
from hardware_profiles.errors import PluginError, user_frames

MAX_PLUGIN_BYTES = 32 << 20  # a plugin's files travel to every process of a run
SKIPPED_DIRS = ("__pycache__", ".git", ".venv", ".ipynb_checkpoints", "node_modules")
_lock = threading.RLock()


def is_path_entry(entry: str, base: Path | None = None) -> bool:
    """Whether a ``plugins:`` entry names a file or folder (else a module name)."""
    if entry.endswith(".py") or "/" in entry or os.sep in entry or entry.startswith(("~", ".", "$")):
        return True
    return base is not None and (base / entry).exists()


def resolve_entries(entries: Any, base: Path | None) -> Any:
    """``plugins:`` with each path made absolute against ``base`` (the config file's folder; None:
    the working folder); module names unchanged. Anything but a list of strings is left for the
    schema to refuse."""
    if not isinstance(entries, list):
        return entries
    out = []
    for e in entries:
        if isinstance(e, str) and e.strip() and is_path_entry(e, base):
            path = Path(os.path.expandvars(os.path.expanduser(e)))
            path = (base / path) if base is not None and not path.is_absolute() else path.absolute()
            out.append(os.path.normpath(path))
        else:
            out.append(e)
    return out


@dataclass(frozen=True)
class PluginSource:
    """One ``plugins:`` entry with what it imports and, for a path, its files' contents."""

    entry: str  # a module name, or an absolute path
    kind: str  # "module", "file", "package" or "folder"
    root: str  # the folder put on sys.path ("" for a module)
    modules: tuple[str, ...]  # the top-level modules it imports
    files: tuple[tuple[str, bytes], ...]  # (path relative to root, content); () for a module
    digest: str



_active: dict[str, PluginSource] = {}  # entry -> the source imported in this process
_roots_added: dict[str, str] = {}  # entry -> the folder its activation put on sys.path


def capture(entry: str, index: int = 0) -> PluginSource:
    """Read a ``plugins:`` entry from this machine (a path's files and their digest)."""
    where = f"plugins[{index}] = {entry!r}"
    if not is_path_entry(entry):
        return PluginSource(entry, "module", "", (entry,), (), hashlib.sha256(entry.encode()).hexdigest())
    path = Path(entry)
    if path.is_file():
        if path.suffix != ".py":
            raise PluginError(f"{where}: a plugin file is a Python module ending in .py")
        kind, root, files = "file", path.parent, [path]
        modules = (path.stem,)
    elif path.is_dir():
        package = (path / "__init__.py").is_file()
        kind, root = ("package", path.parent) if package else ("folder", path)
        files = sorted(_walk(path))
        modules = (path.name,) if package else tuple(sorted(p.stem for p in path.glob("*.py")))
        if not modules:
            raise PluginError(f"{where}: the folder holds no .py file (a package has __init__.py; a plain "
                              "folder's .py files are each imported)")
    else:
        raise PluginError(f"{where}: no such file or folder (a path in a config is relative to the config file; "
                          "a module name has no '/' and no .py)")
    for name in modules:
        if not name.isidentifier():
            raise PluginError(f"{where}: {name!r} is not a valid module name (letters, digits and '_'); rename it")
    total = sum(f.stat().st_size for f in files)
    if total > MAX_PLUGIN_BYTES:
        raise PluginError(f"{where}: its files hold {total / 2**20:.0f} MiB; a plugin's files travel to every "
                          f"process of a run (at most {MAX_PLUGIN_BYTES >> 20} MiB): keep data elsewhere "
                          "(dataset.root) or install the plugin as a package")
    contents = tuple((f.relative_to(root).as_posix(), f.read_bytes()) for f in files)
    digest = hashlib.sha256()
    for rel, data in contents:
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return PluginSource(str(path), kind, str(root), modules, contents, digest.hexdigest())


def _walk(folder: Path):
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith(".")]
        for name in filenames:
            if not name.endswith((".pyc", ".pyo")) and not name.startswith("."):
                yield Path(dirpath) / name


def load_plugins(entries: list[str]) -> list[PluginSource]:
    """Import the ``plugins:`` entries (resolved: paths absolute) in this process; returns their
    sources. An entry imported before is imported again only if its files changed since (a plugin
    edited in a notebook's session, or fixed before a resume); one whose files are not on this
    machine but were shipped here with a config is active already. Raises :class:`PluginError`
    naming the entry."""
    out = []
    for i, entry in enumerate(entries):
        with _lock:
            source = _active.get(entry)
            if source is not None and source.kind != "module" and _changed(source):
                forget(source)
                source = None
            if source is None:
                source = capture(entry, i)
                activate(source, i)
        out.append(source)
    return out


def _changed(source: PluginSource) -> bool:
    """Whether a path entry's files on this machine differ from what was imported (if they are here)."""
    path = Path(source.entry)
    if not path.exists() or not _stats_known(source):
        return False
    now = _stats(source)
    if now == _file_stats.get(source.entry):
        return False
    fresh = capture(source.entry)
    _file_stats[source.entry] = now
    return fresh.digest != source.digest


_file_stats: dict[str, tuple] = {}  # entry -> (file, mtime, size) of what was imported from its own folder


def _stats(source: PluginSource) -> tuple:
    root = Path(source.root)
    out = []
    for f in sorted(_walk(Path(source.entry))) if Path(source.entry).is_dir() else [Path(source.entry)]:
        try:
            st = f.stat()
        except OSError:
            continue
        out.append((f.relative_to(root).as_posix(), st.st_mtime_ns, st.st_size))
    return tuple(out)


def _stats_known(source: PluginSource) -> bool:
    if source.entry not in _file_stats:
        _file_stats[source.entry] = _stats(source)
    return True


def forget(source: PluginSource) -> None:
    """Undo ``source``'s import in this process: its modules and what it registered."""
    prefixes = tuple(f"{m}." for m in source.modules)
    for name in [n for n in sys.modules if n in source.modules or n.startswith(prefixes)]:
        del sys.modules[name]
    for reg in REGISTRIES.values():
        for name in reg.names(scan=False):
            if reg.origin(name) == Origin("plugin", source.entry):
                reg.remove(name)
    _active.pop(source.entry, None)
    _file_stats.pop(source.entry, None)
    root = _roots_added.pop(source.entry, None)
    if root is not None and root not in _roots_added.values() and root in sys.path:
        sys.path.remove(root)


def activate(source: PluginSource, index: int | None = None) -> None:
    """Import ``source`` in this process (a path's files from where they are, or from a copy
    written into the temporary folder where they are absent or differ); idempotent."""
    with _lock:
        done = _active.get(source.entry)
        where = f"plugins[{index}] = {source.entry!r}" if index is not None else f"plugin {source.entry!r}"
        if done is not None:
            if done.digest != source.digest:
                raise PluginError(f"{where}: this process{_at(here())} imported other contents of it earlier; "
                                  "a process imports a plugin once (start a new one for the changed files)")
            return
        root = _root_for(source)
        if root and root not in sys.path:
            sys.path.append(root)  # last: a plugin never shadows an installed module
            _roots_added[source.entry] = root
        origin = Origin("plugin", source.entry)
        for name in source.modules:
            _import(name, root, where, origin)
        _active[source.entry] = source
        if root == source.root:  # imported from its own files: an edit of them is seen (load_plugins)
            _file_stats[source.entry] = _stats(source)


def _root_for(source: PluginSource) -> str:
    """Where the source's files are imported from: their own folder if it holds them unchanged,
    else a copy under this machine's temporary folder (written once per digest)."""
    if source.kind == "module":
        return ""
    if all(_same_file(Path(source.root) / rel, data) for rel, data in source.files):
        return source.root
    dest = Path(tempfile.gettempdir()) / f"hetsim-plugins-{os.getuid()}" / source.digest[:24]
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=dest.parent))
        for rel, data in source.files:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        try:
            os.rename(staging, dest)
        except OSError:  # another process of this node wrote it first: same digest, same files
            import shutil  # only on that race

            shutil.rmtree(staging, ignore_errors=True)
    return str(dest)


def _same_file(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _import(name: str, root: str, where: str, origin: Origin) -> None:
    loaded = sys.modules.get(name)
    if loaded is not None:
        if root and not _under(getattr(loaded, "__file__", None), root):
            raise PluginError(f"{where}: its module name {name!r} is taken by {_where_from(loaded)}, imported "
                              "earlier in this process; rename the file")
        return
    if root:
        spec = importlib.util.find_spec(name)
        if spec is None or not _under(spec.origin, root):
            taken = spec.origin if spec is not None else "?"
            raise PluginError(f"{where}: its module name {name!r} is taken by {taken} (found first on sys.path); "
                              "rename the file")
    before = {kind: set(reg.names(scan=False)) for kind, reg in REGISTRIES.items()}
    try:
        with loading_from(origin):
            importlib.import_module(name)
    except PluginError as err:
        _forget(before)
        raise PluginError(f"{where}: {err}") from None
    except ModuleNotFoundError as err:
        _forget(before)
        if err.name == name and not root:
            raise PluginError(f"{where}: no module named {name!r}{_at(here())} (a module name must be installed or "
                              "on PYTHONPATH there; a file is given as a path ending in .py)") from None
        raise PluginError(f"{where}: importing it failed{_at(here())}: {type(err).__name__}: {err}"
                          f"{_frames(err)}") from None
    except Exception as err:  # noqa: BLE001 - any failure of the user's module is the user's to fix
        _forget(before)
        raise PluginError(f"{where}: importing it failed{_at(here())}: {type(err).__name__}: {err}"
                          f"{_frames(err)}") from None


def _at(where: str) -> str:
    return f" {where}" if where else ""


def _frames(err: BaseException) -> str:
    frames = user_frames(err)
    return f"\n{frames}" if frames else ""


def _forget(before: dict[str, set[str]]) -> None:
    """Undo what a plugin that failed to import had registered already."""
    for kind, reg in REGISTRIES.items():
        for name in set(reg.names(scan=False)) - before.get(kind, set()):
            reg.remove(name)


def _under(path: str | None, root: str) -> bool:
    return bool(path) and os.path.realpath(path).startswith(os.path.join(os.path.realpath(root), ""))


def _where_from(module: Any) -> str:
    return getattr(module, "__file__", None) or f"the built-in module {module.__name__!r}"


def here() -> str:
    """Where this process is, for messages from a Ray worker ("on node <id> (<host>, pid <n>)");
    "" in the process the user started (its messages need no such detail)."""
    ray = sys.modules.get("ray")  # asked, never imported: Ray stays in engine/ray
    if ray is None or not sys.argv or not sys.argv[0].endswith("default_worker.py"):
        return ""
    try:
        node = f"node {ray.get_runtime_context().get_node_id()[:12]} " if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - only a message's detail
        node = ""
    return f"on {node}({socket.gethostname()}, pid {os.getpid()})"


def active_sources() -> list[PluginSource]:
    return list(_active.values())
