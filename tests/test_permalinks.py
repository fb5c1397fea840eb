"""Permalinks: round trip, hostile values fall back with a notice, old links still open."""

from urllib.parse import quote

import pytest

from lensapp.ui import permalinks as pl
from lensapp.ui.permalinks import View


@pytest.mark.parametrize("view", [
    View(),
    View(tab="jacobian", prompt="Le 12 + 7 = ?\n<img src=x>&a=b#c", layers="20-28", k=7, targets=("Paris", "Lyon"),
         metric="target_rank", chat=True),
    View(tab="generate", prompt="La capitale de la France est", max_tokens=12, temperature=0.7, lens="both",
         layers="0,5,-1", k=3, seed=7, raw=True),
    View(tab="compare", prompts=("The capital of France is", "La capitale de l'Italie est\n&x=1", "3"), lens="both",
         layers="20-29", targets=("Paris", "Rome"), metric="kl"),
    View(tab="logit", prompt="word " * 300, start=120),
])
def test_round_trip(view):
    back, notices = pl.decode(pl.encode(view))
    assert notices == []
    used = pl.tab_fields(view.tab) + ("tab",)
    assert {f: getattr(back, f) for f in used} == {f: getattr(view, f) for f in used}
    back2, notices2 = pl.decode(pl.query_string(view))          # through the URL text as well
    assert back2 == back and notices2 == []


def test_encode_is_versioned_and_only_carries_the_tab():
    q = pl.encode(View(tab="logit", max_tokens=30))
    assert q["v"] == str(pl.FORMAT_VERSION) == "2" and q["tab"] == "logit"      # v=2: BOS counts (test_link_versions)
    assert "max_tokens" not in q and "temperature" not in q
    assert "targets" not in pl.encode(View(tab="generate"))


def test_v1_link_still_opens():
    # Frozen: a link as format v=1 writes it. Later formats must keep reading it.
    link = ("v=1&tab=jacobian&prompt=The%20Eiffel%20Tower%20is%20located%20in%20the%20city%20of&layers=all&k=5"
            "&targets=Paris&metric=kl&chat=0")
    view, notices = pl.decode(link)
    assert notices == []
    assert view == View(tab="jacobian", prompt="The Eiffel Tower is located in the city of", metric="kl",
                        targets=("Paris",))
    assert pl.decode("tab=generate&max_tokens=4")[0].max_tokens == 4          # no v: read as v=1


def test_empty_and_unknown_keys():
    assert pl.decode(None) == (View(), [])
    assert pl.decode("") == (View(), [])
    assert pl.decode({"__theme": "dark", "utm_source": "x"}) == (View(), [])


@pytest.mark.parametrize("query, field", [
    ({"tab": "admin"}, "tab"),
    ({"k": "-3"}, "k"),
    ({"k": "1e9"}, "k"),
    ({"k": "five"}, "k"),
    ({"metric": "<script>"}, "metric"),
    ({"lens": "tuned"}, "lens"),
    ({"max_tokens": "100000"}, "max_tokens"),
    ({"temperature": "nan"}, "temperature"),
    ({"temperature": "-1"}, "temperature"),
    ({"chat": "maybe"}, "chat"),
    ({"prompt": "x" * 100_000}, "prompt"),
    ({"prompt": "   "}, "prompt"),
    ({"prompt": "a\x00b"}, "prompt"),
    ({"layers": "1;drop table"}, "layers"),
    ({"targets": ",".join("abcdefghijk")}, "targets"),
])
def test_hostile_values_fall_back_with_a_notice(query, field):
    view, notices = pl.decode(query)
    assert getattr(view, field) == getattr(View(), field)
    assert len(notices) == 1 and f"link's {field}" in notices[0] and "default" in notices[0]


def test_layers_checked_against_the_model():
    view, notices = pl.decode({"layers": "0-99"}, n_layers=30)
    assert view.layers == "all" and "layers" in notices[0]
    view, notices = pl.decode({"tab": "jacobian", "layers": "3"}, n_layers=30, jlens_layers=[0, 4, 29])
    assert view.layers == "all" and "Jacobian" in notices[0]
    view, notices = pl.decode({"tab": "jacobian", "layers": "4,29"}, n_layers=30, jlens_layers=[0, 4, 29])
    assert view.layers == "4,29" and notices == []
    view, notices = pl.decode({"tab": "jacobian", "layers": "3-10"}, n_layers=30, jlens_layers=[0, 4, 29])
    assert view.layers == "3-10" and notices == []                # a range means the J layers inside it
    view, notices = pl.decode({"tab": "logit", "layers": "-1"}, n_layers=30)
    assert view.layers == "-1" and notices == []


def test_non_utf8_escapes():
    view, notices = pl.decode("tab=logit&prompt=%FF%FEabc&k=3")
    assert view.prompt == View().prompt and view.k == 3
    assert "not UTF-8" in notices[0]
    # The same link after the web server replaced the bad bytes (what gr.Request hands over)
    view, notices = pl.decode({"prompt": "\ufffd\ufffdabc"})
    assert view.prompt == View().prompt and notices


def test_unknown_versions():
    view, notices = pl.decode({"v": "7", "tab": "generate"})
    assert view.tab == "generate" and "newer version" in notices[0]
    view, notices = pl.decode({"v": "x", "k": "2"})
    assert view.k == 2 and "v=x" in notices[0]
    view, notices = pl.decode("v=%C2%B2&k=3")                   # "²".isdigit() is True, int("²") fails
    assert view.k == 3 and "v=²" in notices[0]


def test_many_params_and_odd_objects():
    view, notices = pl.decode("&".join(f"p{i}=1" for i in range(500)))
    assert view == View() and notices
    view, notices = pl.decode(object())                       # not a mapping at all
    assert view == View() and notices


def test_hostile_prompt_survives_as_text():
    evil = "<img src=x onerror=alert(1)>"
    view, notices = pl.decode("prompt=" + quote(evil))
    assert view.prompt == evil and notices == []


def test_empty_means_empty():
    assert View().targets == ()                                          # opening the app cold names no target
    assert pl.decode("tab=logit&prompt=Hi").view.targets == ()          # a link that names none gets none
    assert pl.decode("tab=logit&prompt=Hi&targets=").view.targets == ()
    assert pl.decode("tab=logit&targets=Paris").view.targets == ("Paris",)
    assert pl.decode("tab=generate&seed=").view.seed is None


def test_compare_links_need_two_prompts():
    view, notices = pl.decode("tab=compare&prompt1=A%20b")
    assert view.prompts == pl.DEFAULT_COMPARE and "fewer than two" in notices[0]
    view, notices = pl.decode("tab=compare&prompt1=A&prompt2=%20&prompt3=C")
    assert view.prompts == ("A", "C") and "prompt2" in notices[0]
    assert pl.encode(View(tab="compare", prompts=("a", "b")))["prompt2"] == "b"


@pytest.mark.parametrize("query, field", [({"seed": "-1"}, "seed"), ({"seed": "x"}, "seed"), ({"raw": "2"}, "raw"),
                                          ({"start": "-5"}, "start")])
def test_new_fields_fall_back_too(query, field):
    view, notices = pl.decode(query)
    assert getattr(view, field) == getattr(View(), field) and f"link's {field}" in notices[0]


def test_punctuation_title_and_note_round_trip():
    view = View(tab="logit", punct=True, title="Where Paris appears",
                note="Look at layer 22, `␣city`: <script>window.pwned=1</script>\nand below.")
    q = pl.encode(view)
    assert q["punct"] == "1" and q["title"] == view.title and q["note"] == view.note
    back, notices = pl.decode(pl.query_string(view))
    assert notices == [] and (back.punct, back.title, back.note) == (True, view.title, view.note)
    assert pl.decode(pl.query_string(View(tab="compare", punct=True)))[0].punct
    plain = pl.encode(View(tab="generate"))
    assert "title" not in plain and "note" not in plain and "punct" not in plain      # only when they say something


@pytest.mark.parametrize("query, field", [
    ({"title": "x" * 121}, "title"),
    ({"title": "one\ntwo"}, "title"),
    ({"title": "a\x1bb"}, "title"),
    ({"note": "x" * 1001}, "note"),
    ({"note": "a\x00b"}, "note"),
    ({"note": "a\x07b"}, "note"),
    ({"note": "a\ud800b"}, "note"),
    ({"punct": "maybe"}, "punct"),
])
def test_hostile_titles_notes_and_punct_fall_back_with_a_notice(query, field):
    view, notices = pl.decode(query)
    assert getattr(view, field) == getattr(View(), field)
    assert len(notices) == 1 and f"link's {field}" in notices[0] and "default" in notices[0]


def test_a_note_is_text_and_points_at_cells():
    from lensapp.ui.notes import highlight_of, note_markdown

    md = note_markdown("<b>Title</b>", "layer 22: `␣city` <script>window.pwned=1</script>")
    assert "<script>" not in md and "<b>" not in md and "&lt;script&gt;" in md
    hl = highlight_of("Look at layer 22 and layers 3-4, `␣city` or ` town`", range(30))
    assert hl.layers == {22, 3, 4} and hl.tokens == {" city", " town"}
    assert hl.marks(22, " city") and hl.marks(3, " town") and not hl.marks(21, " city") and not hl.marks(22, "x")
    assert not highlight_of("nothing here", range(30)) and not highlight_of(None, range(30))
    assert highlight_of("`Paris`", range(30)).marks(5, " Paris")       # a token without its space still matches


def test_a_number_reads_back_as_it_was_written():
    """A float is written short where that reads back the same (0.7), else exactly: an alpha of 1.015625 is not
    cut to 6 digits (the link and the alphas box once wrote 1.01562)."""
    view = View(tab="intervene", alphas=(1.015625, 0.1, -20.0), temperature=0.123456789)
    assert pl.encode(view)["alphas"] == "1.015625, 0.1, -20"
    back, notices = pl.decode(pl.query_string(view))
    assert notices == [] and (back.alphas, back.temperature) == (view.alphas, view.temperature)
