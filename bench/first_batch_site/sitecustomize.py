"""Timestamps of a build's start-up, for bench/first_batch.py; nothing in the product.

bench/first_batch.py puts this folder on ``PYTHONPATH`` with ``FIRST_BATCH_TRACE`` naming a file,
so every process of the build (the command and its workers, which inherit the environment)
appends one JSON line per event: ``[pid, event, time.time(), detail]``. The events come from the
wire protocol of ``builders.encode.worker`` (a JSON header's first key) and, where encoding stays
in the command's process, from ``InProcess.submit``; so the same trace reads any version of the
builder:

- ``python``: this process's interpreter reached site (just before its own code); ``forked``:
  this process was forked (a worker, by the workers' parent);
- ``imported MODULE``: a module named in ``MODULES`` finished importing;
- ``sent tokenizer`` (the build told a worker where the tokenizer lies; builders from de0d367
  on), ``sent contract`` (the build sent a worker its start-up message), ``sent group`` (the build
  handed a worker a row group; ``detail`` true for the plan's sample, which builders from the
  start-up's second round hand out before they plan), ``sent ready`` (a worker said ready), ``sent
  engine`` (a worker said which engine it chose; from de0d367 on), ``sent batch`` (a worker sent
  an encoded batch, ``detail`` its conversations), ``received batch`` (the build took one);
- ``in-process batch``: the command's process encoded a batch itself (``--workers 1``).

The environment's own sitecustomize, if another folder on the path holds one, runs after it.
"""

import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

TRACE = os.environ.get("FIRST_BATCH_TRACE")
# ``--workers 1`` encodes in a pool of one worker process (bench/first_batch.py's --pool-of-one):
# two processes, each with a core of its own on 2 cores
POOL_OF_ONE = bool(os.environ.get("FIRST_BATCH_POOL_OF_ONE"))
MODULES = (
    "builders.build",
    "builders.encode.worker",
    "builders.formats.render",
    "fastokens",
    "pandas",
)


def event(name: str, detail=None) -> None:
    line = json.dumps([os.getpid(), name, time.time(), detail]) + "\n"
    descriptor = os.open(TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


def header_key(data) -> str | None:
    """The first key of a JSON header on a worker's channel, else None."""
    head = bytes(memoryview(data)[:32]) if isinstance(data, bytes | bytearray) else b""
    if not head.startswith(b'{"'):
        return None
    return head[2:].split(b'"', 1)[0].decode("ascii", "replace")


def patch_connection(module) -> None:
    send, receive = module.Connection.send_bytes, module.Connection.recv_bytes

    def send_bytes(self, data, *args, **kwargs):
        key = header_key(data)
        if key in ("tokenizer", "contract", "group", "ready", "engine", "batch"):
            header = json.loads(bytes(data)) if key in ("batch", "group") else {}
            # a group's detail: whether it is the plan's sample (before 291c2a8 ``keep`` said so;
            # since, the sample's groups are those sent with no pass ``share``)
            if key == "batch":
                detail = header["batch"]
            elif "keep" in header:
                detail = header["keep"]
            else:
                detail = "share" in header and header["share"] is None
            event(f"sent {key}", detail)
        return send(self, data, *args, **kwargs)

    def recv_bytes(self, *args, **kwargs):
        data = receive(self, *args, **kwargs)
        if header_key(data) == "batch":
            event("received batch", json.loads(data)["batch"])
        return data

    module.Connection.send_bytes, module.Connection.recv_bytes = send_bytes, recv_bytes


def patch_pool(module) -> None:
    submit = module.InProcess.submit

    def timed(self, table, *args, **kwargs):
        submit(self, table, *args, **kwargs)
        event("in-process batch", table.num_rows)

    module.InProcess.submit = timed
    if POOL_OF_ONE:
        module.encoding = module.Pool


def patch_spawn(module) -> None:
    """With ``POOL_OF_ONE``, the command starts its one worker early, as it starts several."""
    if not POOL_OF_ONE:
        return
    if hasattr(module, "_start_into"):
        # builders before the workers were forked by one parent
        start_into = module._start_into
        module._start_into = lambda started, count: start_into(started, count or 1)
        return
    early = module.early

    @contextlib.contextmanager
    def early_one(requested):
        if requested != 1:
            with early(requested) as started:
                yield started
            return
        started = module.start(1)
        module._waiting[:] = started
        try:
            yield started[:]
        finally:
            module._waiting.clear()
            module.stop(started)

    module.early = early_one


PATCHES = {
    "multiprocessing.connection": patch_connection,
    "builders.encode.pool": patch_pool,
    "builders.encode.spawn": patch_spawn,
}


class Watch(importlib.abc.MetaPathFinder):
    """Patches or times a module as it finishes importing; imports nothing itself."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES and name not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            if name in PATCHES:
                PATCHES[name](module)
            if name in MODULES:
                event(f"imported {name}")

        spec.loader.exec_module = exec_module
        return spec


def chain() -> None:
    """Run the environment's own sitecustomize, if another folder on the path holds one."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        other = os.path.join(folder or ".", "sitecustomize.py")
        if os.path.abspath(folder or ".") != here and os.path.isfile(other):
            with open(other, encoding="utf-8") as file:
                exec(compile(file.read(), other, "exec"), {"__name__": "sitecustomize"})
            return


if TRACE:
    event("python")
    os.register_at_fork(after_in_child=lambda: event("forked"))
    sys.meta_path.insert(0, Watch())
chain()
