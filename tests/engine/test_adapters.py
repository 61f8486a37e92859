"""Engine adapters: a generic OpenAI-compatible server is asked only what the OpenAI API
defines; vLLM is asked its own paths; an unnamed server is identified by /v1/models."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from servegate.bench import cases, client, driver, sizing
from servegate.engine import adapters, openai
from servegate.engine.openai import Endpoint
from tests.bench.test_stream_faults import Engine


class Recording(Engine):
    paths: ClassVar[list[str]] = []
    bodies: ClassVar[list[dict[str, object]]] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        super().do_GET()

    def do_POST(self) -> None:
        self.paths.append(self.path)
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        self.bodies.append(json.loads(body))
        self.headers.replace_header("Content-Length", "0")
        super().do_POST()


@pytest.fixture
def generic() -> Iterator[tuple[str, type[Recording]]]:
    from http.server import ThreadingHTTPServer

    handler = type("G", (Recording,), {"mode": "ok", "paths": [], "bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_generic_server_is_healthy_through_its_model_list(
    generic: tuple[str, type[Recording]],
) -> None:
    url, handler = generic
    assert openai.health(Endpoint(url, engine=adapters.OPENAI)) == (True, "")
    assert "/health" not in handler.paths
    ok, why = openai.health(Endpoint(url, engine=adapters.VLLM))
    assert not ok
    assert why == "/health answered 404"


def test_generic_server_is_not_asked_for_tokenize_or_metrics(
    generic: tuple[str, type[Recording]],
) -> None:
    url, handler = generic
    endpoint = Endpoint(url, engine=adapters.OPENAI)
    assert client.metrics_text(endpoint) == ""
    with pytest.raises(ValueError, match="no tokenize endpoint"):
        client.tokenize(endpoint, "m", [{"role": "user", "content": "x"}])
    assert sizing.probe(endpoint, "m").fingerprint == ""
    assert not {"/metrics", "/tokenize"} & set(handler.paths)


def test_bench_identifies_an_unnamed_server_and_sends_only_openai_fields(
    generic: tuple[str, type[Recording]], tmp_path: Path
) -> None:
    url, handler = generic
    spec = cases.Spec(Endpoint(url), "m", cases.parse_cases(["regular"], ["1k"], [1]),
                       repetitions=1, max_tokens=40, warmup=False)  # fmt: skip
    bench = driver.Bench(spec, tmp_path / "r.json")
    bench.prepare()
    assert bench.result["engine"]["resolved"] == "openai"  # owned_by "someone"
    bench.measure(spec.cases[0], 1)
    [body] = [b for b in handler.bodies if "messages" in b]
    assert not {"cache_salt", "top_k", "min_p"} & set(body)
    assert "/metrics" not in handler.paths


def test_detect_by_owned_by() -> None:
    assert adapters.detect([{"id": "demo", "owned_by": "vllm"}]) is adapters.VLLM
    assert adapters.detect([{"id": "demo", "owned_by": "llamacpp"}]) is adapters.OPENAI
    with pytest.raises(Exception, match="no engine adapter named 'sglang'"):
        adapters.by_name("sglang")
