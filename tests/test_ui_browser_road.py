"""issue 28 in Chromium against the running app: a link restores every branch of a generation, and prompts in
Chinese and with emoji draw every token legibly (characters split over tokens joined, never U+FFFD)."""

from __future__ import annotations

from urllib.parse import quote

from test_ui_browser import RUN_TIMEOUT, blind_event_urls, cells, field, open_app, shot, wait_plot

PROMPT = "The capital of France is"


def token_id(embedded_dir, text: str) -> int:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(embedded_dir)(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_a_link_restores_every_branch(page, app_url, embedded_dir):
    from gradio_client import Client

    rome, berlin = token_id(embedded_dir, " Rome"), token_id(embedded_dir, " Berlin")
    branches = f"1=#{rome};1=#{rome},3=#{berlin}"
    blind_event_urls(page)
    open_app(page, app_url, f"tab=generate&prompt={quote(PROMPT)}&max_tokens=6&layers=24-29&branches={quote(branches)}")
    wait_plot(page, "generate-heatmap")
    page.locator("#branch-listing").get_by_text("branch 2").wait_for(timeout=RUN_TIMEOUT)
    listing = " ".join(page.inner_text("#branch-listing").split())        # the page collapses runs of spaces
    client = Client(app_url, verbose=False)
    for forced in ([f"1=#{rome}"], [f"1=#{rome}", f"3=#{berlin}"]):
        expected = client.predict(PROMPT, 6, "logit", "24-29", 5, 0.0, None, False, False, forced,
                                  api_name="/generate")
        assert " ".join(expected["text"].replace("\n", " ↵ ").split()) in listing, (expected["text"], listing)
    assert "branch 1: step 1" in listing and "parts at step 1" in listing
    assert page.locator("#branch-shown input[type=radio]").count() == 2
    wait_plot(page, "branch-heatmap")
    assert {int(c["layer"]) for c in cells(page, "branch-heatmap")} == set(range(24, 30))
    wait_plot(page, "branch-divergence")
    page.wait_for_function("() => location.search.includes('branches=')", timeout=30_000)
    assert quote(branches, safe="") in page.url or branches in page.url
    shot(page, "branches")
    assert not page.errors


def test_chinese_and_emoji_draw_every_token_legibly(page, app_url):
    open_app(page, app_url, f"tab=logit&prompt={quote('巴黎是法国的首都')}&layers=27-29")
    wait_plot(page, "logit-heatmap")
    shown = {c["input token"] for c in cells(page, "logit-heatmap")}
    assert {"巴(1/2)", "巴(2/2)", "黎(1/3)", "是", "的"} <= shown, shown
    assert not any("\ufffd" in t or "<0x" in t for t in shown)           # every character completes in context
    wait_plot(page, "logit-strip")
    assert "\ufffd" not in page.content()
    shot(page, "chinese")

    open_app(page, app_url, f"tab=generate&prompt={quote('Pizza 🍕 night with friends 🎉 is')}&max_tokens=5"
                            "&layers=28-29")
    wait_plot(page, "generate-heatmap")
    step0 = next(c for c in cells(page, "generate-heatmap") if c["step"] == "0")
    assert "\ufffd" not in str(step0)
    assert {c["generated"] for c in cells(page, "generate-heatmap")} and "\ufffd" not in page.content()
    text = field(page, "generate-text").input_value()
    assert "\ufffd" not in text
    page.get_by_role("tab", name="Logit lens").click()
    field(page, "logit-prompt").fill("Pizza 🍕 night with friends 🎉")
    page.locator("#logit-run").click()
    page.wait_for_function("() => document.querySelector('#logit-heatmap') && "
                           "document.querySelector('#logit-heatmap').innerHTML.includes('🎉(3/3)')",
                           timeout=RUN_TIMEOUT)
    labels = {c["input token"] for c in cells(page, "logit-heatmap")}
    assert {"␣🍕(1/3)", "🍕(2/3)", "🍕(3/3)", "␣🎉(1/3)", "🎉(3/3)"} <= labels, labels
    assert not any("\ufffd" in t for t in labels) and "\ufffd" not in page.content()
    shot(page, "emoji")
    assert not page.errors
