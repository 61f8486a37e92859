"""A small real OpenAI-compatible server for servegate's tests.

It maps the stack's ``build/libtiny.so`` and answers /health, /v1/models,
/v1/chat/completions (streamed too, as the bench asks: a short prefill, then one word a
token at a steady pace) and /tokenize (words). The committed ``mode`` file makes a commit
misbehave the way a broken release does ("slow-decode": half again as long between
tokens; "stream-forever": a stream that never ends).
"""

import ctypes
import hashlib
import http.server
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODE_FILE = ROOT / "mode"
MODE = MODE_FILE.read_text().strip() if MODE_FILE.exists() else "ok"
LATE: list[object] = []  # what a request loaded after the start


def started_marker() -> Path:
    """A file outside the release that says this checkout was started once."""
    key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"tiny-started-{key}"


def library() -> Path:
    lib = ROOT / "build" / "libtiny.so"
    if MODE == "foreign-on-restart":  # clean at its first start, not at the next ones
        key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
        marker = Path(tempfile.gettempdir()) / f"tiny-started-{key}"
        first = not marker.exists()
        marker.touch()
        if first:
            return lib
    if MODE in ("foreign-so", "foreign-on-restart"):
        copy = Path(tempfile.mkdtemp(prefix="tiny-cache-")) / lib.name
        shutil.copy2(lib, copy)
        return copy
    return lib


def answer(text: str) -> dict[str, object]:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(503 if MODE == "never-healthy" else 200, {})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": "tiny", "root": str(ROOT), "max_model_len": 8192}]})
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize":
            texts = (
                [body["prompt"]]
                if "prompt" in body
                else [str(m.get("content", "")) for m in body.get("messages", [])]
            )
            count = sum(len(t.split()) for t in texts)
            self._send(200, {"count": count, "tokens": [], "max_model_len": 8192})
            return
        if body.get("stream"):
            self._stream(body)
            return
        if MODE == "crash-after-answer" and not started_marker().exists():
            # the first start dies with its first answer, which a child sends once this
            # process is dead (the client cannot see the answer before the death); the
            # service manager starts it again, and that one stays
            started_marker().touch()
            parent = os.getpid()
            if os.fork() == 0:
                self.server.socket.close()  # type: ignore[attr-defined]  # the next start binds
                stat = Path(f"/proc/{parent}/stat")
                while stat.exists():
                    try:
                        if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                            break
                    except (OSError, IndexError):
                        break
                    time.sleep(0.005)
                self._send(200, answer("hello from tiny"))
                self.wfile.flush()
                os._exit(0)
            os._exit(1)
        if MODE == "foreign-after-answer" and not LATE:
            # clean while it is proven; the gate's first request loads a library from
            # outside the release into the very process that was proven
            copy = Path(tempfile.mkdtemp(prefix="tiny-late-")) / "libtiny.so"
            shutil.copy2(library(), copy)
            LATE.append(ctypes.CDLL(str(copy)))
        self._send(200, answer("" if MODE == "empty-answer" else "hello from tiny"))

    def _stream(self, body: dict[str, object]) -> None:
        """An SSE answer: 250 ms of prefill, then ``max_tokens`` words, 4 ms apart (6 ms
        in mode slow-decode), then the usage and [DONE]."""
        words = int(body.get("max_tokens") or 16)  # type: ignore[call-overload]
        # the user's document in tokens of four characters (what the bench sized it by
        # without a tokenizer); the chat wrapper and the instructions are not counted
        user = str(body.get("messages", [{}])[-1].get("content", ""))  # type: ignore[index]
        prompt = len(user.rsplit("\n\n", 1)[0]) // 4
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def event(doc: object) -> None:
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
            self.wfile.flush()

        time.sleep(0.25)  # the prefill: long beside a busy box's scheduling hiccups
        while MODE == "stream-forever":  # a text that never ends, a chunk every 50 ms
            event({"choices": [{"index": 0, "delta": {"content": "w "}}]})
            time.sleep(0.05)
        gap = 0.006 if MODE == "slow-decode" else 0.004
        for i in range(words):
            event({"choices": [{"index": 0, "delta": {"content": f"w{i % 10} "}}]})
            time.sleep(gap)
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        usage = {"prompt_tokens": prompt, "completion_tokens": words}
        event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def log_message(self, fmt: str, *args: object) -> None:
        print("tiny:", fmt % args, flush=True)


def main() -> None:
    port = int(sys.argv[sys.argv.index("--port") + 1])
    print(f"tiny: mode {MODE}, root {ROOT}", flush=True)
    if MODE == "print-args-exit":  # as a server logs its own arguments, then dies
        print(f"INFO non-default args: {sys.argv[1:]} env {os.environ.get('HF_TOKEN')}", flush=True)
        sys.exit(3)
    if MODE == "exit-on-restart":  # starts once; every later start exits at once
        if started_marker().exists():
            sys.exit(3)
        started_marker().touch()
    if MODE == "exit":
        print("tiny: fatal: refusing to start", flush=True)
        sys.exit(3)
    if MODE == "crash-loop":
        time.sleep(1.5)
        print("tiny: crashed after start", flush=True)
        sys.exit(4)
    if MODE == "env-elsewhere" and os.environ.get("PYTHONPATH") != "/tmp":
        env = dict(os.environ, PYTHONPATH="/tmp")
        os.execve(sys.executable, [sys.executable, "-m", "tinystack.server", *sys.argv[1:]], env)
    if MODE == "slow-start":  # a long start-up: time for a connection to drop mid-promote
        print("tiny: warming up slowly", flush=True)
        time.sleep(20)
    if MODE == "graph-downgrade":  # the line vLLM logs at INFO when it drops the graphs
        print(
            "INFO [vllm.py:812] Cudagraph mode PIECEWISE is not compatible with compilation "
            "mode 0. Overriding to NONE.",
            flush=True,
        )
    if MODE == "log-gone":  # its own log file removed under the service manager's feet
        manager = Path(f"/proc/{os.getppid()}/fd")
        for fd in manager.iterdir():
            target = os.readlink(fd)
            if target.endswith(".log") and "supervisord" not in target:
                os.unlink(target)
    lib = ctypes.CDLL(str(library()))
    assert lib.tiny_version() == 7
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"tiny: listening on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
