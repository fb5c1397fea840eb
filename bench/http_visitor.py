"""A visitor's client as light as a browser's: Gradio's queue as the page itself calls it (POST
/gradio_api/queue/join, then read the session's event stream, /gradio_api/queue/data), no gradio_client.

Why the workshop uses it: thirty browsers are thirty other machines, but here the visitors share the app's two
cores. gradio_client spent ~0.085 CPU seconds a request on this machine (a link open: 0.085 s against 0.004 s
here, measured 2026-12-02, bench/RESULTS.md), so its thirty processes took a third of the machine's CPU from the
app in the workshop (runs I-Z). This client takes the same route as the page and gradio_client (the queue's
join and event stream, where answers are written with the queue's ready-made JSON: `ui/api.py`), with the same
headers; what it saves is only the client's own overhead. The tests still call every endpoint through gradio_client
(tests/test_api.py): this is the bench's load, not the API's check.

    api = endpoints(url)                 # once: each endpoint's fn_index and parameters, in order, with defaults
    HttpVisitor(url, api, {"X-Forwarded-For": "10.77.0.5"}).predict(api_name="/lens", prompt="...")
"""

from __future__ import annotations

import json
import uuid

import httpx

JOIN_SECONDS = 10.0      # a browser that cannot join the queue within this shows an error: counted as lost
ANSWER_SECONDS = 600.0   # longest wait for an answer once joined (the app's own deadlines are shorter)
BIG_ANSWER = 1 << 20     # an answer longer than this is checked, not parsed: `predict` returns None for it


class AppError(RuntimeError):
    """The app answered with an error (its one line), or never answered."""


def endpoints(url: str) -> dict[str, tuple[int, list[tuple[str, object]]]]:
    """{"/lens": (its fn_index, [(parameter name, default), ...]), ...} from the app's /config and /gradio_api/info.
    Every input of these endpoints is an API parameter (checked: a page-only input would need a placeholder)."""
    root = url.rstrip("/")
    info = httpx.get(root + "/gradio_api/info", timeout=30).json()["named_endpoints"]
    out = {}
    for dep in httpx.get(root + "/config", timeout=30).json()["dependencies"]:
        name = f"/{dep.get('api_name')}"
        if name in info:
            params = [(p["parameter_name"], p.get("parameter_default")) for p in info[name]["parameters"]]
            if len(params) != len(dep["inputs"]):
                raise ValueError(f"{name}: {len(dep['inputs'])} inputs but {len(params)} API parameters")
            out[name] = (dep["id"], params)
    return out


def page_cookie(url: str, headers: dict | None = None) -> str | None:
    """What a browser keeps from loading the page: the `Cookie` header its page's requests then carry (the app's
    visitor cookie, which makes it a person of its own behind a shared address: service/identity.py), or None."""
    page = httpx.get(url, headers=headers or {}, timeout=30)
    return "; ".join(f"{name}={value}" for name, value in page.cookies.items()) or None


class HttpVisitor:
    def __init__(self, url: str, api: dict, headers: dict | None = None, session: str | None = None):
        """session: one session hash for every request, as a page keeps one while it is open (one request at a
        time); None: a new one a request."""
        self.api, self.session = api, session
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers or {},
                                 timeout=httpx.Timeout(ANSWER_SECONDS, connect=JOIN_SECONDS))

    def predict(self, api_name: str, **kwargs):
        """The endpoint's answer (its outputs, one item unwrapped), or AppError with what the app said."""
        fn_index, params = self.api[api_name]
        unknown = set(kwargs) - {name for name, _ in params}
        if unknown:
            raise TypeError(f"{api_name} has no parameter {sorted(unknown)}")
        session = self.session or uuid.uuid4().hex     # one a request: its stream carries only this answer
        join = self.http.post("/gradio_api/queue/join", timeout=JOIN_SECONDS, json={
            "data": [kwargs.get(name, default) for name, default in params], "fn_index": fn_index,
            "session_hash": session, "trigger_id": None, "event_data": None})
        if join.status_code != 200:
            raise AppError(f"join refused ({join.status_code}): {join.text[:200]}")
        with self.http.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                if len(line) > BIG_ANSWER and _big_success(line):
                    return None
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return _answer(message)
        raise AppError("the stream closed without an answer")


def _big_success(line: str) -> bool:
    """A large answer that says it is complete and successful, read without parsing it (a browser parses on its
    own machine; here a 26 MB answer's parse took ~0.4 s of the app's cores, run AC)."""
    return '"msg":"process_completed"' in line[:200] and '},"success":true,' in line[-400:]


def _answer(message: dict):
    output = message.get("output") or {}
    if not message.get("success", False) or "error" in output:
        said = output.get("error")
        raise AppError(str(said) if said is not None else "error (no message)")
    data = output["data"]
    return data[0] if len(data) == 1 else data
