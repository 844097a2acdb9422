"""Serving explanations to visitors: which models a server may load (locked mode), the work budget, and a
thread-safe cache of loaded models. Used by the demo; any server over ``normx.explain`` can use it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from normx import errors
from normx.models.tasks import TASKS
from normx.serving.messages import excerpt

log = logging.getLogger("normx.demo")

LOCKED_ENV = "NORMX_DEMO_LOCKED"  # "1": locked mode (only the allow-list loads); also on when $SPACE_ID is set
MODELS_ENV = "NORMX_DEMO_MODELS"  # comma-separated allow-list for locked mode (default: the presets that load)
BUDGET_ENV = "NORMX_DEMO_BUDGET_GFLOP"  # the work one request may take (normx.serving.budget); default BUDGET_GFLOP
BUDGET_GFLOP = 1500.0  # ~10 s of work on a 2-core CPU (MiniLM: Value Zeroing on ~220 tokens, IG x50 on ~450)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def is_locked(locked: bool | None = None) -> bool:
    """Locked mode: the argument if given, else $NORMX_DEMO_LOCKED, else on when running on Spaces ($SPACE_ID)."""
    if locked is not None:
        return bool(locked)
    if os.environ.get(LOCKED_ENV) is not None:
        return _truthy(os.environ.get(LOCKED_ENV))
    return bool(os.environ.get("SPACE_ID"))


def resolve_locked(locked: bool | None, host: str | None) -> bool:
    """Whether the demo serves locked: as asked (``--locked`` / ``--unlocked``, $NORMX_DEMO_LOCKED, Spaces); if
    nothing was asked, unlocked (any folder or hub id loads) only when the server listens on loopback, since an
    unlocked page lets anyone who reaches it load files of the server's disk."""
    if locked is None and (os.environ.get(LOCKED_ENV) is not None or os.environ.get("SPACE_ID")):
        locked = is_locked()
    address = (host or "127.0.0.1").strip("[]")
    loopback = address in LOOPBACK or address.startswith("127.")
    if locked is None:
        if not loopback:
            log.warning("serving on %s, not loopback: locked mode (only the allow-list loads); pass --unlocked to "
                        "let visitors load any local folder or hub id", address)
        return not loopback
    if not locked and not loopback:
        log.warning("UNLOCKED on %s: anyone who reaches this server can make it load any model folder on its disk "
                    "or any hub id", address)
    return locked


def budget_gflop(value: float | None = None) -> float:
    """The per-request work budget: ``value``, else $NORMX_DEMO_BUDGET_GFLOP, else :data:`BUDGET_GFLOP`."""
    if value is None:
        env = os.environ.get(BUDGET_ENV)
        try:
            value = float(env) if env else BUDGET_GFLOP
        except ValueError:
            raise errors.InvalidInputError(f"${BUDGET_ENV}={env!r} is not a number of GFLOP") from None
    if not value > 0:
        raise errors.InvalidInputError(f"the work budget must be a positive number of GFLOP, got {value!r}")
    return float(value)


def available_presets() -> list[str]:
    """The offline presets that can load here: base package installed, trained adapter present (if it has one)."""
    import importlib.util

    from normx.zoo.presets import PRESETS

    out = []
    for name, preset in PRESETS.items():
        if importlib.util.find_spec(preset.package.replace("-", "_")) is None:
            continue
        if preset.recipe is not None and preset.metrics() is None:  # training writes metrics.json last
            continue
        out.append(name)
    return out


def allowed_models(models: Sequence[str] | None = None) -> list[str]:
    """The locked-mode allow-list: ``models``, else $NORMX_DEMO_MODELS, else the presets that can load here."""
    if models is None:
        env = os.environ.get(MODELS_ENV, "")
        models = [m.strip() for m in env.split(",") if m.strip()] or available_presets()
    return list(dict.fromkeys(models))


class ModelCache:
    """``(model, tokenizer)`` per model name, loaded once with ``loader`` (``normx.load_model``) and kept.

    In locked mode only names in ``allowed`` load, and a failed load says only that it failed (its details go to
    the log). At most ``max_models`` stay loaded (least recently used goes
    first). Failures are not cached: a fixed folder loads on retry. Loads of different models run in parallel;
    two requests for the same model wait for one load.
    """

    def __init__(self, loader: Callable | None = None, *, locked: bool = False, allowed: Sequence[str] = (),
                 max_models: int = 6, task: str | None = None):
        self.loader = loader  # name -> (model, tokenizer); default: _load_model with ``task`` (the demo's --task)
        self.task = task
        self.locked = locked
        self.allowed = list(allowed)
        self.max_models = max_models
        self.loads: dict[str, int] = {}  # name -> number of loads (tests check that it stays 1)
        self._models: OrderedDict[str, tuple] = OrderedDict()
        self._lock = threading.Lock()  # guards the dicts
        self._loading: dict[str, threading.Lock] = {}  # one lock per name, held while that model loads

    def peek(self, name: str):
        """``(model, tokenizer)`` if ``name`` is loaded, else None (never loads)."""
        with self._lock:
            return self._models.get((name or "").strip())

    def preload(self, name: str) -> None:
        """Load ``name`` in a background thread, so that the first request is quicker; a failure is logged and
        shown again, as a message, when a request asks for the model."""
        def load():
            try:
                self.get(name)
            except Exception as exc:
                log.warning("could not preload %s: %s", name, exc)

        threading.Thread(target=load, daemon=True).start()

    def put(self, name: str, model, tokenizer) -> None:
        """Register an already loaded model under ``name`` (tests, or a host app that loads its own)."""
        with self._lock:
            self._models[name] = (model, tokenizer)

    def check(self, name: str) -> str:
        """``name`` stripped, or the refusal: in locked mode one sentence for every name off the allow-list, the
        same whatever it names (a folder, a file, nothing), so that it tells nothing of the server's disk."""
        if name is not None and not isinstance(name, str):
            raise errors.InvalidInputError(f"the model must be a name (a string), got {excerpt(name)}")
        name = (name or "").strip()
        if not name:
            raise errors.ModelLoadError("no model chosen: pick a preset" + ("" if self.locked else
                                                                           " or give a model folder"))
        if self.locked and name not in self.allowed and name not in self._models:
            raise errors.ModelLoadError(f"this demo serves only its own models ({', '.join(self.allowed)}); it "
                                        "loads no other name, folder or file")
        return name

    def get(self, name: str):
        name = self.check(name)
        with self._lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:
            with self._lock:
                if name in self._models:  # loaded by the request we waited for
                    return self._models[name]
            log.info("loading model %s", name)
            try:
                loaded = self.loader(name) if self.loader is not None else _load_model(name, self.task)
            except Exception as exc:
                if not self.locked:
                    raise
                log.exception("could not load %s", name)  # the details (paths, versions) stay in the log
                raise errors.ModelLoadError(f"model {excerpt(name)} could not be loaded on this server (the "
                                            "details are in its log)") from exc
            with self._lock:
                self._models[name] = loaded
                self.loads[name] = self.loads.get(name, 0) + 1
                while len(self._models) > self.max_models:
                    self._models.popitem(last=False)
            return loaded


def default_model_name(given: str | None, locked: bool, allowed: Sequence[str], default: str) -> str:
    """The model selected at start: ``given``, else ``default`` unless locked mode does not allow it."""
    if given:
        return given
    return allowed[0] if locked and allowed and default not in allowed else default


def examples(models: Sequence[str]) -> list[list[str]]:
    """(model, text, second text) example inputs of the presets among ``models``."""
    from normx.zoo.presets import PRESETS

    return [[name, text, pair] for name in models if name in PRESETS for text, pair in PRESETS[name].examples]


def input_fields(name: str, locked: bool) -> tuple[bool, bool, str]:
    """What the page asks for with this model: (second text box?, continuation steps?, a note in Markdown)."""
    info = preset_info(name)
    note = info["description"] or ("" if locked else "a local folder, PEFT adapter folder or hub id")
    return (info["inputs"] != "single" and info["task"] != "causal-lm", info["task"] in ("causal-lm", "unknown"),
            f"*{note}*" if note else "")


BATCH_WINDOW_ENV, BATCH_MAX_ENV = "NORMX_DEMO_BATCH_WINDOW_MS", "NORMX_DEMO_BATCH_MAX"
BATCH_THREADS_ENV = "NORMX_DEMO_BATCH_THREADS"
HEAVY_ENV, HEAVY_THREADS_ENV, HEAVY_NICE_ENV = ("NORMX_DEMO_HEAVY_SLOTS", "NORMX_DEMO_HEAVY_THREADS",
                                                "NORMX_DEMO_HEAVY_NICE")
HEAVY_NICE = 10  # nice values between the expensive lane and the rest of the server (normx.serving.lanes)


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, and its cgroup's CPU quota where one is set (a container,
    a Space: ``os.cpu_count()`` counts the host's)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as handle:
            quota, period = handle.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def env_int(name: str, default: int) -> int:
    """A whole number from the environment variable ``name`` (``default`` if unset)."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise errors.InvalidInputError(f"${name} must be a whole number, got {value!r}") from None


def work_gate(budget: float | None = None):
    """The demo's :class:`~normx.serving.lanes.WorkGate`: ``budget`` GFLOP per request (:func:`budget_gflop`);
    ``$NORMX_DEMO_HEAVY_SLOTS`` (default 1) requests at a time in the expensive lane, with
    ``$NORMX_DEMO_HEAVY_THREADS`` torch threads each (default: every core) at ``$NORMX_DEMO_HEAVY_NICE`` (default
    10) nice values below the rest of the server."""
    from normx.serving.lanes import WorkGate

    return WorkGate(budget_gflop(budget), heavy_slots=env_int(HEAVY_ENV, 1),
                    heavy_threads=env_int(HEAVY_THREADS_ENV, available_cores()),
                    heavy_nice=env_int(HEAVY_NICE_ENV, HEAVY_NICE))


def batcher():
    """The demo's one-pass lane (:class:`~normx.serving.batching.Batcher`): NormXLogit-like requests run in one
    scheduler thread with ``$NORMX_DEMO_BATCH_THREADS`` torch threads (default: every core but one, which the event
    loop and the request threads need meanwhile: torch's threads slow down several times when one of them has to
    share its core), one at a time by default. ``$NORMX_DEMO_BATCH_MAX`` > 1 explains up to that many requests that
    arrive within ``$NORMX_DEMO_BATCH_WINDOW_MS`` (default 10 ms) of each other in one padded pass: equal to what
    each gets alone up to float32 rounding, not bit for bit (a padded batch multiplies differently shaped matrices),
    and on a 2-core CPU with MiniLM no faster under the crowd of demo/README.md, hence off by default."""
    from normx.serving.batching import Batcher

    try:
        window = float(os.environ.get(BATCH_WINDOW_ENV, "10"))
    except ValueError as exc:
        raise errors.InvalidInputError(f"${BATCH_WINDOW_ENV} must be a number ({exc})") from None
    return Batcher(window_ms=window, max_batch=env_int(BATCH_MAX_ENV, 1),
                   threads=env_int(BATCH_THREADS_ENV, max(1, available_cores() - 1)))


def limit_malloc_arenas(arenas: int = 2) -> None:
    """At most ``arenas`` glibc malloc arenas for the threads a server starts from now on (glibc gives each busy
    thread an arena of its own, and freed memory stays in them: the memory high-water then grows with the number
    of request threads, not with the work); nothing where glibc is not the C library."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(name).mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        return


THREADS_ENV = "NORMX_DEMO_TORCH_THREADS"
QUEUE_STATS_ENV, QUEUE_STATS_EVERY = "GRADIO_ANALYTICS_CACHE_FREQUENCY", 1000


def server_process(threads: int | None = None) -> None:
    """What a server process sets up once, before its request threads start: its log, its malloc arenas, and
    ``threads`` intra-op threads for torch (default ``$NORMX_DEMO_TORCH_THREADS``, else 1): a server runs many
    requests at once, so it parallelises across them, and an expensive request then holds one core, not all of
    them, while cheap ones are served on the others (OpenMP threads of concurrent requests would also spin against
    each other). Gradio's queue recomputes its statistics summary (pandas over up to 10,000 past events) every
    ``$GRADIO_ANALYTICS_CACHE_FREQUENCY`` events, by default after every one: 2 ms per event on a fresh server, 9 ms
    once 10,000 are kept, on a worker thread that holds the GIL; here every :data:`QUEUE_STATS_EVERY` events unless
    set."""
    import torch

    os.environ.setdefault(QUEUE_STATS_ENV, str(QUEUE_STATS_EVERY))  # read when the queue is made (Blocks.queue)
    server_logging()
    limit_malloc_arenas()
    threads = env_int(THREADS_ENV, 1) if threads is None else threads
    if threads < 1:
        raise errors.InvalidInputError(f"torch threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)


def server_logging() -> None:
    """A server's log: normx's INFO lines (model loads), transformers' errors only, no per-request HTTP lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def preset_info(name: str) -> dict:
    """What the page needs to know about a model name before loading it: inputs (single / pair / unknown), task."""
    from normx.zoo.presets import PRESETS

    preset = PRESETS.get((name or "").strip())
    if preset is None:
        return {"inputs": "unknown", "task": "unknown", "description": ""}
    return {"inputs": preset.inputs, "task": preset.task, "description": preset.description}


def _load_model(name: str, task: str | None = None):
    """A model as the demo serves it: loaded (with ``task``, the demo's ``--task``, for models whose config names no
    head normx supports; a GGUF file is a causal LM), its PEFT adapters merged where that keeps its outputs (half the
    operations per pass for the LoRA presets, so every method runs faster; :func:`normx.models.merge_adapters`)."""
    from normx.models import merge_adapters
    from normx.zoo.loading import load_model

    model, tokenizer = load_model(name, task=task, notify=lambda message: log.warning("%s", message))
    model, merged = merge_adapters(model, tokenizer)
    if merged:
        log.info("%s: adapters merged into the base weights for serving", name)
    return model, tokenizer


def demo_arguments(argv: list[str] | None = None, default_model: str = "minilm-sst2") -> argparse.Namespace:
    """The demo's command line: ``--host``, ``--port`` (1..65535), ``--model``, ``--locked`` / ``--unlocked``,
    ``--models`` (a list), ``--budget-gflop`` (positive); argparse's usage error otherwise."""
    parser = argparse.ArgumentParser(prog="normx demo", description="Serve the normx Gradio demo.")
    parser.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1, on a Space 0.0.0.0; "
                        "$GRADIO_SERVER_NAME)")
    parser.add_argument("--port", type=_port, default=None, help="port, 1..65535 (default 7860, or the next free one "
                        "off a Space; $GRADIO_SERVER_PORT)")
    parser.add_argument("--model", default=None, help=f"the model selected at start (default {default_model}): a "
                        "preset, a model folder, a PEFT adapter folder, a GGUF file or a hub id")
    parser.add_argument("--task", default=None, choices=sorted(TASKS),
                        help="the head to load models with when their config names none normx supports")
    lock = parser.add_mutually_exclusive_group()
    lock.add_argument("--locked", action="store_true", default=None,
                      help=f"only the allow-list loads (${MODELS_ENV}, default: the presets installed and trained); "
                           f"also ${LOCKED_ENV}=1. The default when the host is not loopback")
    lock.add_argument("--unlocked", dest="locked", action="store_false",
                      help="let visitors load any local folder or hub id, also on a non-loopback host (a warning says "
                           "so); the default on loopback only")
    parser.add_argument("--models", default=None, help="comma-separated allow-list for --locked")
    parser.add_argument("--budget-gflop", type=float, default=None,
                        help=f"work one request may take (default {BUDGET_GFLOP:g}, ~10 s on a 2-core CPU; "
                             f"${BUDGET_ENV})")
    args = parser.parse_args(argv)
    if args.budget_gflop is not None and not args.budget_gflop > 0:
        parser.error(f"--budget-gflop must be positive, got {args.budget_gflop}")
    args.models = None if args.models is None else [m.strip() for m in args.models.split(",") if m.strip()]
    return args


DEFAULT_PORT = 7860  # Gradio's


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def busy_port_notice(host: str, port: int | None) -> str | None:
    """What to tell the person starting the demo when Gradio's default port is taken (Gradio then moves to the next
    free one), or None."""
    if port is not None or os.environ.get("GRADIO_SERVER_PORT") or port_free(host, DEFAULT_PORT):
        return None
    return (f"normx demo: port {DEFAULT_PORT} is in use (another server?); serving on the next free port (its address "
            "follows). Pass --port N to choose one.")


def _port(value: str) -> int:
    if not value.strip().isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: use a number in 1..65535")
    return int(value)
