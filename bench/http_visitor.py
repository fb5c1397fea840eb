"""A visitor's client as light as a browser's: Gradio's HTTP API (POST /gradio_api/call/<api>, then read the
answer's event stream), no gradio_client.

Why the workshop uses it: thirty browsers are thirty other machines, but here the visitors share the app's two
cores. gradio_client spent ~0.085 CPU seconds a request on this machine (a link open: 0.085 s against 0.004 s
here, measured 2026-12-02, bench/RESULTS.md), so its thirty processes took a third of the machine's CPU from the
app in the workshop (runs I-X). This client asks the same queue for the same handlers with the same headers;
what it saves is only the client's own overhead. The tests still call every endpoint through gradio_client
(tests/test_api.py): this is the bench's load, not the API's check.

    api = endpoints(url)                             # once: each endpoint's parameters, in order, with defaults
    HttpVisitor(url, api, {"X-Forwarded-For": "10.77.0.5"}).predict(api_name="/lens", prompt="...")
"""

from __future__ import annotations

import json

import httpx

JOIN_SECONDS = 10.0      # a browser that cannot join the queue within this shows an error: counted as lost
ANSWER_SECONDS = 600.0   # longest wait for an answer once joined (the app's own deadlines are shorter)


class AppError(RuntimeError):
    """The app answered with an error (its one line), or never answered."""


def endpoints(url: str) -> dict[str, list[tuple[str, object]]]:
    """{"/lens": [(parameter name, default), ...], ...} from the app's /gradio_api/info."""
    info = httpx.get(url.rstrip("/") + "/gradio_api/info", timeout=30).json()
    return {name: [(p["parameter_name"], p.get("parameter_default")) for p in spec["parameters"]]
            for name, spec in info["named_endpoints"].items()}


class HttpVisitor:
    def __init__(self, url: str, api: dict, headers: dict | None = None):
        self.api = api
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers or {},
                                 timeout=httpx.Timeout(ANSWER_SECONDS, connect=JOIN_SECONDS))

    def predict(self, api_name: str, **kwargs):
        """The endpoint's answer (its outputs, one item unwrapped), or AppError with what the app said."""
        params = self.api[api_name]
        unknown = set(kwargs) - {name for name, _ in params}
        if unknown:
            raise TypeError(f"{api_name} has no parameter {sorted(unknown)}")
        data = [kwargs.get(name, default) for name, default in params]
        path = f"/gradio_api/call{api_name}"
        join = self.http.post(path, json={"data": data}, timeout=JOIN_SECONDS)
        if join.status_code != 200:
            raise AppError(f"join refused ({join.status_code}): {join.text[:200]}")
        event, answer = None, None
        with self.http.stream("GET", f"{path}/{join.json()['event_id']}") as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    event = line[7:].strip()
                elif line.startswith("data: ") and event in ("complete", "error"):
                    answer = json.loads(line[6:])
                    break
        if event == "error":
            said = answer.get("error") if isinstance(answer, dict) else answer
            raise AppError(str(said) if said is not None else "error (no message)")
        if event != "complete":
            raise AppError("the stream closed without an answer")
        return answer[0] if isinstance(answer, list) and len(answer) == 1 else answer
