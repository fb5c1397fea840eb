"""A link means what it meant (ui/permalinks.py, FORMAT_VERSION): a link of every format version opened on an app
that reads with BOS first names, token for token, what it named when it was made.

v=1 counted a prompt's positions in its own tokens; v=2 counts them in the tokens the app reads, BOS first where
the Jacobian lens was fitted so (service/prompts.py). Each token is checked by decoding the tokens the app reads
(a readout's `input_ids`, or `service.prompts.ids`) against the prompt's own tokens from the tokenizer."""

from __future__ import annotations

import pytest
from hostile import assert_within_limits, expect, scaled, texts, watch
from hypothesis import given
from hypothesis import strategies as st

from lensapp import config, jlens
from lensapp.service import LensService
from lensapp.service.kinds import KINDS
from lensapp.service.selection import Selection
from lensapp.ui import permalinks as pl
from lensapp.ui.form import asked
from lensapp.ui.views import TAB_VIEWS, TOKEN_POSITIONS, view_fields

FRANCE = "The capital of France is"
# One link of every format version, opened on the app that reads with BOS, and the token its position names.
PINNED = {
    1: (f"v=1&tab=components&prompt={FRANCE}&target=Paris&position=4", " is"),      # issue 47's link
    2: (f"v=2&tab=components&prompt={FRANCE}&target=Paris&position=4", " France"),
}


@pytest.fixture(scope="module")
def bos_service(tiny_model_dir):
    """The tiny Llama read as the shipped lens is: with a Jacobian lens fitted with BOS first (provenance bos)."""
    s = LensService.start(config.Config.of(model=str(tiny_model_dir), backend="transformers", jlens="none",
                                        cache_entries=0, request_timeout=30))
    s.wait_ready(300)
    n, d = s.info.n_layers, s.info.d_model
    s.install_jlens(jlens.JacobianLens(J=jlens.identity(d, list(range(n - 1))), n_prompts=0, d_model=d,
                                       provenance={"bos": True}))
    assert s.prompts.bos and s.prompts.ids(FRANCE)[0] == s.prompts.bos_id        # the app reads with BOS first
    yield s
    s.close()


def opened(service, link: str):
    """The link as the page (ui/__init__.py's `restored`) and its prefetch decode it, then the readout the
    components tab asks of its inputs (ui/components_tab.py's `read_components`)."""
    view, notices = pl.decode(link, **pl.as_read_by(service))
    assert notices == []
    tab = TAB_VIEWS[view.tab]
    return KINDS[tab.kind].run(service, asked(tab, service, tab.values_of(view)))


def token_read(service, result) -> str:
    return service.prompts.tokenizer.decode([result.input_ids[result.position]])


def test_every_version_has_a_pinned_link():
    assert set(PINNED) == set(range(1, pl.FORMAT_VERSION + 1))
    assert pl.encode(pl.View(tab="components"))["v"] == str(pl.FORMAT_VERSION)


@pytest.mark.parametrize("version", sorted(PINNED))
def test_a_pinned_link_names_its_token(bos_service, version):
    link, token = PINNED[version]
    result = opened(bos_service, link)
    assert result.input_ids[0] == bos_service.prompts.bos_id and token_read(bos_service, result) == token


def test_a_v1_link_names_what_the_prompt_s_own_tokens_name(bos_service):
    """Issue 47's link, against the tokenizer: position 4 of the prompt's own tokens is ` is`, and the app's
    readout explains that token (the link's 4 read as the app counts now would be ` France`)."""
    tok = bos_service.prompts.tokenizer
    own = tok(FRANCE)["input_ids"]
    result = opened(bos_service, PINNED[1][0])
    assert tok.decode([own[4]]) == " is" == token_read(bos_service, result)
    assert result.input_ids[1:] == own and result.position == 5
    assert opened(bos_service, PINNED[1][0].replace("v=1&", "")).position == 5        # no v: v=1


def test_an_app_without_bos_moves_nothing(tiny_service):
    assert not tiny_service.prompts.bos
    for link, _ in PINNED.values():
        result = opened(tiny_service, link)
        assert result.position == 4 and token_read(tiny_service, result) == " is"


def named(value, ids: list[int]) -> list[int]:
    """The tokens a position field's value names in `ids` (an int, or a selection like '0-2,-1')."""
    return [ids[i] for i in Selection(str(value)).resolve(len(ids), "position")]


@pytest.mark.parametrize("tab, name, value, chat", [
    ("logit", "start", 2, False),
    ("jacobian", "start", 0, False),
    ("intervene", "positions", "0-2,-1", False),
    ("intervene", "positions", "last", False),
    ("intervene", "source_positions", "1,-2", False),
    ("intervene", "source_positions", "0--2", False),
    ("components", "position", 0, False),
    ("components", "position", -2, False),
    ("components", "position", 3, True),              # the chat template starts with the BOS itself
])
def test_every_position_field_names_the_same_tokens(bos_service, tab, name, value, chat):
    """Each field that counts a prompt's tokens, from a v=1 link: what it names in the tokens the app reads now is
    what the link named in the prompt's own tokens (the tokenizer's, or the chat template's)."""
    texts = {"prompt": FRANCE, "source": "Rome is the capital of Italy"}
    link = {"v": "1", "tab": tab, "chat": str(int(chat)), **texts, name: str(value)}
    view, notices = pl.decode(link, prompts=bos_service.prompts)
    assert notices == []
    text = texts[TOKEN_POSITIONS[name]]
    tok = bos_service.prompts.tokenizer
    own = (tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=True)["input_ids"] if chat else tok(text)["input_ids"])
    read = bos_service.prompts.ids(text, chat)
    assert named(getattr(view, name), read) == named(value, own)
    assert (len(read) > len(own)) == (not chat)                      # the case moved, or needed no move


def test_a_current_link_is_read_as_written(bos_service):
    view = pl.View(tab="intervene", prompt=FRANCE, positions="0-2,-1", source="Rome", source_positions="0")
    back, notices = pl.decode(pl.query_string(view), prompts=bos_service.prompts)
    assert notices == [] and (back.positions, back.source_positions) == ("0-2,-1", "0")
    newer, notices = pl.decode(f"v={pl.FORMAT_VERSION + 1}&tab=components&position=4", prompts=bos_service.prompts)
    assert newer.position == 4 and "newer version" in notices[0]


def test_a_position_moved_out_of_bounds_falls_back_with_a_notice(bos_service):
    view, notices = pl.decode(f"v=1&tab=components&prompt={FRANCE}&position={1 << 20}", prompts=bos_service.prompts)
    assert view.position == -1 and len(notices) == 1 and "link's position" in notices[0]


def test_every_field_that_counts_positions_is_declared():
    """A link field that names a position is in TOKEN_POSITIONS (so a version moves it), but `patterns` (a layer)
    and `branches` (a generation's steps); its text is a field of every tab that carries it."""
    fields = view_fields()
    says_position = {name for name, x in fields.items() if "position" in f"{x.help} {x.label}".lower()}
    assert says_position - {"patterns"} == set(TOKEN_POSITIONS)
    for view in TAB_VIEWS.values():
        tab = view.fields()
        assert all(TOKEN_POSITIONS[name] in tab for name in tab if name in TOKEN_POSITIONS)


POSITION_TEXTS = st.one_of(texts(), st.sampled_from(["0", "4", "-1", "0-2,-1", "last", str(1 << 20), "9" * 30]))


@scaled(100)
@given(params=st.fixed_dictionaries({"v": st.sampled_from(["1", "2", "x", ""]), "chat": st.sampled_from(["0", "1"])},
                                    optional={"tab": st.sampled_from(sorted(TAB_VIEWS)), "prompt": texts(),
                                              "source": texts(), **dict.fromkeys(TOKEN_POSITIONS, POSITION_TEXTS)}))
def test_decode_with_the_app_s_reading_never_raises(bos_service, params):
    """Any link, of any version, decoded as the page decodes it (with the app's BOS reading): a view within
    limits, each position a value its field reads back, one notice per field at most."""
    view, notices = expect(watch(pl.decode, params, prompts=bos_service.prompts), tuple, errors=())
    assert_within_limits(view)
    fields = view_fields()
    for name in TOKEN_POSITIONS:
        value = getattr(view, name)
        assert fields[name](None if value is None else pl.as_text(value)) == value
    assert len(notices) == len(set(notices))
