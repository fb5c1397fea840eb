"""Hostile input at every door: the service, the tabs' handlers, the API over HTTP, the CLI, links and the chat.

Every example gets a normal result or a clear error: a `RequestError`, a `gr.Error` or exit code 2 whose
message is one line (no traceback; no markup on the page, no HTML entities from the API). A watchdog
bounds every call (nothing may hang), and after the hostile examples a normal request is still served.
The service and handler properties run on the tiny random model (transformers backend, in process);
the API's run over HTTP against the session's app (`app_url`, vLLM), with fewer examples.
Reproduce a failure with the same profile (`ci`, derandomized) or explore: HYPOTHESIS_PROFILE=dev.
"""

from __future__ import annotations

import functools
import json
import math
import re

import pytest
from hostile import (
    DEFAULT_VIEW,
    LAYERS,
    LENSES,
    Api,
    EngineStarted,
    Starts,
    anything,
    assert_one_line,
    assert_within_limits,
    cli_argv,
    conversations,
    expect,
    fields,
    noticed_fields,
    numbers,
    page_outcome,
    post_raw,
    queries,
    run_cli,
    scaled,
    targets_text,
    texts,
    watch,
    words,
)
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from lensapp import config
from lensapp.config import MAX_K, MAX_SEED, MAX_TEMPERATURE
from lensapp.service import ChatRequest, GenerateRequest, LensRequest, RequestError
from lensapp.service import fields as f
from lensapp.service.field import Field
from lensapp.ui import chat_tab, generate_tab, lens_tab
from lensapp.ui import permalinks as pl
from lensapp.ui.kept import value_of

# gr.Warning outside a request (the handlers called directly) is a UserWarning; here it is expected
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")

# -- the service: lens, generate, check, chat (tiny random model, in process) ---------------------------

@pytest.fixture(scope="module")
def tiny(tiny_service):
    return tiny_service


LENS_FIELDS = (
    {"prompts": st.lists(words(), min_size=1, max_size=2).map(tuple), "lens": st.sampled_from(LENSES),
     "layers": st.sampled_from(LAYERS), "k": st.integers(1, MAX_K), "targets": st.lists(words(), max_size=2).map(tuple),
     "raw": st.booleans(), "chat": st.booleans()},
    {"prompts": st.lists(texts(), max_size=5).map(tuple), "lens": anything(), "layers": anything(), "k": numbers(),
     "targets": st.lists(texts(), max_size=9).map(tuple), "raw": anything(), "chat": anything()})
GENERATE_FIELDS = (
    {"prompt": words(), "max_tokens": st.integers(1, 4), "lens": st.sampled_from(LENSES),
     "layers": st.sampled_from(LAYERS), "k": st.integers(1, MAX_K), "temperature": st.floats(0, MAX_TEMPERATURE),
     "seed": st.none() | st.integers(0, MAX_SEED), "chat": st.booleans(), "raw": st.booleans()},
    {"prompt": texts(), "max_tokens": numbers(), "lens": anything(), "layers": anything(), "k": numbers(),
     "temperature": numbers(), "seed": numbers(), "chat": anything(), "raw": anything()})


@scaled(80)
@given(kw=fields(*LENS_FIELDS))
@example(kw={"prompts": ("Hi",), "lens": 10**5000})          # found: str() of the int raised
@example(kw={"prompts": ("Hi",), "lens": [], "raw": []})      # found: unhashable
def test_service_lens(tiny, kw):
    req = expect(watch(LensRequest, **kw), LensRequest)                # a request is read when it is made
    if isinstance(req, RequestError):
        return
    checked = watch(tiny.check, req)
    out = expect(watch(tiny.lens, req), list)
    if isinstance(out, RequestError) or isinstance(checked, RequestError):   # check() refuses what lens() refuses
        assert str(expect(checked, object)) == str(out)
    else:
        assert len(out) == len(req.prompts)


@scaled(60)
@given(kw=fields(*GENERATE_FIELDS))
@example(kw={"prompt": "0", "max_tokens": 4, "temperature": 3.6e-73})   # found: logits / 3.6e-73 -> inf
@example(kw={"prompt": "0", "max_tokens": 1, "temperature": 10**200})   # found (dev): math.isfinite overflowed
def test_service_generate(tiny, kw):
    req = expect(watch(GenerateRequest, **kw), GenerateRequest)
    if isinstance(req, RequestError):
        return
    checked = watch(tiny.check, req)
    out = expect(watch(tiny.generate, req), object)
    if isinstance(out, RequestError) or isinstance(checked, RequestError):
        assert str(expect(checked, object)) == str(out)
    else:
        assert 1 <= len(out.steps) <= req.max_tokens


CHAT_FIELDS = (
    {"messages": conversations(), "lens": st.sampled_from(["logit", "jacobian"]),
     "layer": st.none() | st.integers(0, 3), "max_tokens": st.integers(1, 6), "temperature": st.floats(0, 2),
     "k": st.integers(1, 5), "seed": st.none() | st.integers(0, MAX_SEED)},
    {"messages": st.one_of(st.lists(st.one_of(st.fixed_dictionaries({"role": anything(), "content": texts()}),
                                              anything()), max_size=4).map(tuple), anything()),
     "lens": anything(), "layer": numbers(), "max_tokens": numbers(), "temperature": numbers(), "k": numbers(),
     "seed": numbers()})


@scaled(50)
@given(kw=fields(*CHAT_FIELDS))
def test_service_chat(tiny, kw):
    req = expect(watch(ChatRequest, **kw), ChatRequest)
    if not isinstance(req, RequestError):
        expect(watch(tiny.chat, req), object)


SCHEMA = [value for value in vars(f).values() if isinstance(value, Field)]


@scaled(200)
@given(value=anything())
def test_every_field_gives_a_value_or_a_request_error(value):
    for field in SCHEMA:
        out = expect(watch(field, value), object)
        if isinstance(out, float):
            assert math.isfinite(out)
        if field in (f.K, f.MAX_TOKENS, f.SEED) and isinstance(out, int) and isinstance(value, int):
            assert out == value                    # a whole number is read exactly, however large


def test_the_service_still_serves(tiny):
    r = tiny.lens(LensRequest(prompts=("The capital of France is",), lens="both", k=3, targets=("Paris",)))[0]
    assert r.layers == [0, 1, 2, 3] and tiny.engine.state == "ready"
    assert len(tiny.generate(GenerateRequest(prompt="Hi", max_tokens=2)).steps) >= 1


# -- the page's handlers, as Gradio calls them (through Guard.ui; the rate limit off) ---------------------

@pytest.fixture(scope="module")
def app(tiny):
    """The page's handlers as the app builds them (`ui.build_ui`)."""
    from lensapp import ui

    return ui.build_ui(tiny, config.WebSettings(), config.LimitSettings(rate_limit=0))


LENS_TAB_FIELDS = (
    {"prompt": words(), "layers": st.sampled_from(LAYERS + ["0-3", "", None]), "k": st.integers(1, MAX_K) | st.none(),
     "targets": targets_text(), "metric": st.sampled_from(["top1_prob", "entropy", "kl", "target_prob", "target_rank"]),
     "chat": st.booleans(), "raw": st.booleans(), "start": st.none() | st.integers(0, 60)},
    {"prompt": texts(), "layers": anything(), "k": numbers(), "targets": anything(), "metric": anything(),
     "chat": anything(), "raw": anything(), "start": numbers()})


@scaled(24)
@pytest.mark.parametrize("tab", ["logit", "jacobian"])
@given(kw=fields(*LENS_TAB_FIELDS))
@example(kw={"prompt": "Hi", "layers": 3, "k": 5, "targets": 7, "metric": [], "chat": False, "raw": False,
            "start": None})   # found
def test_lens_tab(app, tab, kw):
    out = page_outcome(app.tabs[tab].run, kw)
    if isinstance(out, dict):
        show_position = functools.partial(lens_tab.pick_position, lens_tab.JACOBIAN_TAB if tab == "jacobian"
                                          else lens_tab.LOGIT_TAB, app.guard)
        for pos in (0, -1, 10**6, "x", None, math.nan):      # a stale or forged position selection
            expect(watch(show_position, {"state": value_of(out["state"]), "position": pos}), object)


GENERATE_TAB_FIELDS = (
    {"prompt": words(), "max_tokens": st.integers(1, 4), "temperature": st.floats(0, MAX_TEMPERATURE) | st.none(),
     "lens": st.sampled_from(LENSES), "layers": st.sampled_from(LAYERS + [""]), "k": st.integers(1, MAX_K),
     "chat": st.booleans(), "seed": st.none() | st.integers(0, MAX_SEED), "raw": st.booleans()},
    {"prompt": texts(), "max_tokens": numbers(), "temperature": numbers(), "lens": anything(), "layers": anything(),
     "k": numbers(), "chat": anything(), "seed": numbers(), "raw": anything()})


@scaled(30)
@given(kw=fields(*GENERATE_TAB_FIELDS))
def test_generate_tab(app, kw):
    out = page_outcome(app.tabs["generate"].run, kw)
    if isinstance(out, dict):
        show_step = functools.partial(generate_tab.pick_step, app.guard)
        for step, lens in ((0, "logit"), (-1, "jacobian"), (10**6, "logit"), ("x", None), (None, 3)):
            expect(watch(show_step, {"state": value_of(out["state"]), "step": step, "table_lens": lens}), object)


CHAT_TAB_FIELDS = (
    {"message": words(), "chatbot": st.just([]) | conversations().map(lambda c: list(c) + [
        {"role": "assistant", "content": "Hi."}]), "layer": st.none() | st.integers(0, 3),
     "lens": st.sampled_from(["logit", "jacobian"]), "max_tokens": st.integers(1, 4),
     "temperature": st.floats(0, MAX_TEMPERATURE), "seed": st.none() | st.integers(0, MAX_SEED)},
    {"message": st.one_of(texts(), anything()), "chatbot": anything(), "layer": numbers(), "lens": anything(),
     "max_tokens": numbers(),
     "temperature": numbers(), "seed": numbers()})


@scaled(30)
@given(kw=fields(*CHAT_TAB_FIELDS))
def test_chat_tab(app, tiny, kw):
    out = page_outcome(functools.partial(chat_tab.send, chat_tab.CHAT, tiny, app.guard), kw)
    if isinstance(out, dict) and out:                            # a blank message is skipped
        assert out["message"].constructor_args["submit_btn"]               # Send is back, the reply written
        assert chat_tab.conversation(out["chatbot"])[-1]["role"] == "assistant"


COMPARE_TAB_FIELDS = (
    {"prompt1": words(), "prompt2": words(), "prompt3": st.just(""), "prompt4": st.just(""),
     "lens": st.sampled_from(LENSES), "layers": st.sampled_from(LAYERS + ["0-3", ""]), "k": st.integers(1, MAX_K),
     "targets": targets_text(), "metric": st.sampled_from(["top1_prob", "kl", "target_prob"]), "chat": st.booleans(),
     "raw": st.booleans()},
    {"prompt1": texts(), "prompt2": anything(), "prompt3": anything(), "prompt4": texts(), "lens": anything(),
     "layers": anything(), "k": numbers(), "targets": anything(), "metric": anything(), "chat": anything(),
     "raw": anything()})


@scaled(24)
@given(kw=fields(*COMPARE_TAB_FIELDS))
def test_compare_tab(app, kw):
    page_outcome(app.tabs["compare"].run, kw)


@scaled(150)
@given(query=queries())
def test_restore_from_any_link(app, query):
    out = expect(watch(app.restore, query), dict)
    notice = next((v for c, v in out.items() if getattr(c, "elem_id", None) == "link-notice"), None)
    if notice is not None and notice.value:
        for line in notice.value.splitlines():
            assert line.startswith("- ") and "<" not in line, line


@scaled(60)
@pytest.mark.parametrize("tab", ["logit", "generate"])
@given(values=st.lists(anything(), min_size=9, max_size=9))
@example(values=["Hi", 10**5000, "x", "logit", "all", 5, False, None, False])   # found: str() of the int raised
def test_the_link_box_follows_any_input(app, tab, values):
    named = dict(zip(app.tabs[tab].view.input_names(), values))
    query = expect(watch(lambda v: pl.query_string(app.tabs[tab].view.view_of(v)), named), str, errors=())
    view, _ = pl.decode(query)
    assert view.tab == tab


# -- links: decode never raises, keeps every field within limits, one notice per bad field ----------------

LINK_NAMES = st.sampled_from(sorted(pl.view_fields()) + ["v", "__theme", ""])


@scaled(300)
@given(params=st.dictionaries(LINK_NAMES, st.one_of(texts(), anything(), st.sampled_from(["1" * 5000, "-0"]))),
       checked=st.booleans())
@example(params={"v": "1" * 5000, "k": "9" * 1000, "prompt": "a\ud800"}, checked=False)   # found
@example(params={"v": "\n", "temperature": "5\n"}, checked=True)                         # found
def test_decode_any_mapping(params, checked):
    where = {"n_layers": 30, "jlens_layers": [0, 4, 29]} if checked else {}
    view, notices = expect(watch(pl.decode, params, **where), tuple, errors=())
    assert_within_limits(view)
    named = noticed_fields(notices)
    assert len(named) == len(set(named)), notices                          # one notice per bad field
    if any("could not be read" in n for n in notices):                     # str() of a 5000-digit int fails
        assert view == DEFAULT_VIEW
        return
    for name, field in pl.view_fields().items():
        default = "all" if name == "layers" and checked else getattr(DEFAULT_VIEW, name)
        if name in named:
            assert getattr(view, name) == default
        elif name in params and name != "prompts":
            value = getattr(view, name)                        # what the link asked for, as its field reads it:
            assert field(None if value is None else pl.as_text(value)) == value   # written back and read again
        else:
            assert getattr(view, name) == getattr(DEFAULT_VIEW, name)


@scaled(300)
@given(query=queries())
def test_decode_any_query_and_reencode_it(query):
    view, notices = expect(watch(pl.decode, query), tuple, errors=())
    assert_within_limits(view)
    named = noticed_fields(notices)
    assert len(named) == len(set(named)), notices
    again, notices = pl.decode(pl.query_string(view))                      # the link box's link opens cleanly
    assert notices == []
    for name in pl.tab_fields(view.tab) + ("tab",):
        if name == "temperature":                                          # the link writes 6 digits
            assert again.temperature == pytest.approx(view.temperature, rel=1e-5)
        else:
            assert getattr(again, name) == getattr(view, name), name


# -- the CLI: bad input is one line on stderr and exit 2, before any engine starts -------------------------

@pytest.fixture(scope="module")
def cli_starts(embedded_dir):
    """`cli.main` as it is, on the embedded model, but the tokenizer and lens load once per module and an
    engine start is recorded (and stopped) instead of run. Yields the list of starts."""
    from lensapp.engine.run.core import Engine
    from lensapp.service import service as svc

    starts, lenses, real_lens = Starts(), {}, svc.load_configured_jlens

    def start(self):
        starts.n += 1
        raise EngineStarted

    def load_configured_jlens(engine, model):
        key = (config.resolve_jlens(engine), engine.jlens_layers)
        if key not in lenses:
            lenses[key] = real_lens(engine, model)
        return lenses[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(svc, "load_tokenizer", functools.lru_cache(svc.load_tokenizer))
        mp.setattr(svc, "load_configured_jlens", load_configured_jlens)
        mp.setattr(Engine, "start", start)
        yield starts


@scaled(40)
@given(argv=cli_argv())
def test_cli(cli_starts, argv):
    before = cli_starts.n
    code, out, err = expect(watch(run_cli, argv), tuple, errors=())
    assert "Traceback" not in err
    event(str(code) if code != 2 else "error: " + err[7:30])
    if code == "engine":                                   # valid input: it would run now
        assert cli_starts.n == before + 1
        return
    assert cli_starts.n == before, "an engine started for bad input"
    if code == ("argparse", 0):
        assert {"-h", "--help"} & set(argv)
        return
    assert out == ""
    if code == 2:
        assert err.startswith("error: ") and err.endswith("\n"), err
        assert_one_line(err[len("error: "):-1])
    else:
        assert code == ("argparse", 2), code
        *usage, last = err.rstrip("\n").split("\n")        # argparse: its usage, then one line saying what is wrong
        assert usage and usage[0].startswith("usage: lensapp") and re.match(r"lensapp( \w+)?: error: ", last), err


# -- the API over HTTP: /lens and /generate on the session's app (vLLM), a few dozen examples -------------

API_EXAMPLES = 50            # each refused example costs ~0.1 s, each served one ~1 s on a small CPU
ENTITY = re.compile(r"&(#\d+|#x[0-9a-fA-F]+|[a-zA-Z]+);")


@pytest.fixture(scope="module")
def api(app_url) -> Api:
    return Api(app_url)


def api_fields(endpoint: str) -> tuple[dict, dict]:
    """(valid, hostile) arguments of an endpoint, in its order; JSON carries no lone surrogate or 5000-digit int."""
    text, number, other = texts(surrogates=False), numbers(json_safe=True), anything(json_safe=True)
    prompt = words().filter(lambda p: not any(0xD800 <= ord(c) <= 0xDFFF for c in p))
    if endpoint == "/lens":
        return ({"prompt": prompt, "lens": st.sampled_from(LENSES), "layers": st.sampled_from(LAYERS + ["28,29"]),
                 "k": st.integers(1, MAX_K), "targets": st.just("") | st.just("Paris, Rome")},
                {"prompt": st.one_of(text, other), "lens": other, "layers": other, "k": number, "targets": other})
    return ({"prompt": prompt, "max_tokens": st.integers(1, 3), "lens": st.sampled_from(LENSES),
             "layers": st.sampled_from(["last", "-1", "28,29"]), "k": st.integers(1, MAX_K),
             "temperature": st.floats(0, MAX_TEMPERATURE)},
            {"prompt": st.one_of(text, other), "max_tokens": number, "lens": other, "layers": other, "k": number,
             "temperature": number})


@st.composite
def api_calls(draw) -> tuple[str, list]:
    endpoint = draw(st.sampled_from(["/lens", "/generate"]))
    return endpoint, list(draw(fields(*api_fields(endpoint))).values())


@settings(max_examples=min(API_EXAMPLES, settings.default.max_examples * API_EXAMPLES // 40))
@given(call=api_calls())
def test_api(api, call):
    from gradio_client.exceptions import AppError

    endpoint, args = call
    out = expect(watch(api, endpoint, *args), dict, errors=(AppError,))
    if isinstance(out, AppError):
        assert "has not enabled verbose error reporting" not in out.message     # an exception escaped Guard
        assert out.title != "Engine error", out.message
        if "&" not in repr(args):                                              # plain text, never escaped
            assert not ENTITY.search(out.message), out.message
    else:
        assert "layers" in out if endpoint == "/lens" else "steps" in out


def test_api_still_serves_and_says_so_plainly(api, app_url):
    import urllib.request

    from gradio_client.exceptions import AppError

    out = api("/lens", "The capital of France is", "logit", "28,29", 3, "Paris")
    assert out["layers"] == [28, 29] and out["lenses"]["logit"]["targets"][0]["text"] == "Paris"
    with pytest.raises(AppError, match="got '<b>&'") as e:                     # quoted as typed: no entities
        api("/lens", "Hi", "logit", "<b>&", 5, "")
    assert e.value.title == "Can't run that"
    with urllib.request.urlopen(app_url + "health", timeout=30) as r:
        assert json.loads(r.read())["state"] == "ready"


@pytest.mark.parametrize("endpoint, data, message", [
    ("/lens", '["Hi", "logit", "all", NaN, "", false, false, false, false]', "k must be a whole number; got nan"),
    ("/lens", '["Hi", "logit", "all", -0.0, "", false, false, false, false]',
     "k must be a whole number in 1..100; got 0"),
    ("/generate", '["Hi", 2, "logit", "last", 5, Infinity, null, false, false, []]',
     "temperature must be a number in 0..2; got inf"),
    ("/generate", '["Hi", -Infinity, "logit", "last", 5, 0, null, false, false, []]',
     "max_tokens must be a whole number; got -inf"),
    ("/lens", '["Hi\\ud800", "logit", "all", 5, "", false, false, false, false]', "the prompt holds a lone surrogate"),
    ("/lens", '["Hi", "logit", "all", 5, "Paris, \\udfff", false, false, false, false]',
     "a target holds a lone surrogate"),
    # more digits than Python reads (a raw call sends every parameter: Gradio's raw endpoints fill in no defaults)
    ("/lens", '["Hi", "logit", "all", 1' + "1" * 4400 + ', "", false, false, false, false]', None),
], ids=["nan", "negative-zero", "infinity", "minus-infinity", "surrogate-prompt", "surrogate-target", "4401-digits"])
def test_api_raw_json(api, app_url, endpoint, data, message):
    status, kind, out = post_raw(app_url, endpoint, '{"data": ' + data + "}")
    if message is None:                                 # refused by the web server itself: a 400, not a 500
        assert status == 400 and len(kind.splitlines()) == 1, (status, kind)
        return
    assert (status, kind) == (200, "error") and out["title"] == "Can't run that", out
    assert out["error"].startswith(message) and len(out["error"].splitlines()) == 1, out["error"]
