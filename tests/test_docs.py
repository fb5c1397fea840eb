"""The docs hold together: every relative link and anchor resolves, and the README stays short."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "RESULTS.md",
               *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    out = set()
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for match in LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):                       # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        assert where.exists(), f"{doc.name}: {target} does not exist"
        if anchor:
            assert anchor in anchors(where), f"{doc.name}: no heading #{anchor} in {where.name}"


def test_the_readme_is_short_and_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 160
    assert "make run" in text and "make test" in text


# -- the docs in step with the code: flags, variables, make targets, endpoints, tabs ----------------------

TEXT_DOCS = [d for d in DOCS if d.name != "RESULTS.md"]          # RESULTS quotes runs as they were, old flags too
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
# Flags of other tools that the docs name on their own (in backticks, without their command).
FOREIGN_FLAGS = {"--memory": "docker run", "--shm-size": "docker run"}


@functools.cache
def parser_options() -> dict[tuple[str, ...], set[str]]:
    """{command path: its --flags}, from lensapp's own argparse parsers: ("lens",), ("space", "push"), ..."""
    import argparse

    from lensapp import cli

    out: dict[tuple[str, ...], set[str]] = {}

    def walk(parser, path):
        out[path] = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))
    walk(cli.build_parser(), ())
    return out


def commands(text: str) -> list[list[str]]:
    """Every shell command in `text`'s code blocks and inline code, as words (comments and `\\` joins done)."""
    spans = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    out = []
    for span in spans:
        for line in span.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line)
            for part in re.split(r"&&|\|\||[|;]", line):
                words = part.split()
                while words and re.match(r"^[A-Z_]+=", words[0]):       # VAR=value before the program
                    words = words[1:]
                if words:
                    out.append(words)
    return out


def lensapp_command(words: list[str]) -> tuple[str, ...] | None:
    """The lensapp (sub)command path a command line runs, or None when it runs something else."""
    starts = {"python -m lensapp.space": ("space",), "python app.py": ("serve",), "python -m lensapp": (),
              ".venv/bin/python app.py": ("serve",), "lensapp": (), ".venv/bin/lensapp": ()}
    prefix = next((p for p in starts if words[:len(p.split())] == p.split()), None)
    if prefix is None or len(words) == len(prefix.split()):       # not lensapp, or only its name
        return None
    rest, path = words[len(prefix.split()):], starts[prefix]
    subs = parser_options()
    for word in rest:
        if (*path, word) in subs:
            path = (*path, word)
        else:
            break
    return path


def runnable(module: str) -> bool:
    """Whether `python -m module` runs something: a package with __main__.py, or a module with a main guard."""
    path = ROOT.joinpath(*module.split("."))
    if (path / "__main__.py").is_file():
        return True
    return path.with_suffix(".py").is_file() and "__name__ == \"__main__\"" in path.with_suffix(".py").read_text()


def doc_problems(text: str) -> list[str]:
    """What `text` names that the code does not have: lensapp flags, make targets and variables, LENSAPP_*
    variables, API endpoints and the tab count."""
    from lensapp import config
    from lensapp.ui.api import endpoints

    problems = []
    options = parser_options()
    every_flag = set().union(*options.values())
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    make_vars = set(re.findall(r"^([A-Z_]+)\s*[?:]?=", makefile, re.M))
    for words in commands(text):
        path = lensapp_command(words)
        if path is not None:
            if not path or path in (("space",),):
                problems.append(f"`{' '.join(words)}`: no such lensapp command")
                continue
            for word in words:
                flag = word.split("=")[0]
                if flag.startswith("--") and flag not in options[path]:
                    problems.append(f"`{' '.join(words)}`: lensapp {' '.join(path)} has no {flag}")
        elif words[:2] == ["python", "-m"] and words[2].startswith("lensapp") and not runnable(words[2]):
            problems.append(f"`{' '.join(words)}`: {words[2]} cannot be run with python -m")
        elif words[0] == "make":
            for word in words[1:]:
                if "=" in word and word.split("=")[0] not in make_vars:
                    problems.append(f"`{' '.join(words)}`: the Makefile has no variable {word.split('=')[0]}")
                elif "=" not in word and not word.startswith("-") and word not in targets:
                    problems.append(f"`{' '.join(words)}`: the Makefile has no target {word}")
        elif words[0].startswith("--") and words[0] not in every_flag | set(FOREIGN_FLAGS):
            problems.append(f"`{' '.join(words)}`: no lensapp command has {words[0]}")
    variables = {config.env_name(f.name) for f in config.SETTING_FIELDS}
    problems += [f"{v}: not a setting" for v in set(re.findall(r"\bLENSAPP_[A-Z_]+\b", text)) - variables]
    endpoints = {e.name for e in endpoints()}
    for name in re.findall(r"api_name=\"/(\w+)\"", text) + re.findall(r"^\| `/(\w+)`", text, re.M):
        if name not in endpoints:
            problems.append(f"/{name}: not an API endpoint")
    for word in re.findall(r"\b(\w+) tabs\b", text, re.I):
        if word.lower() in NUMBERS and NUMBERS[word.lower()] != len(config.TABS):
            problems.append(f"'{word} tabs': the app has {len(config.TABS)} ({', '.join(config.TABS)})")
    return problems


@pytest.mark.parametrize("doc", TEXT_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_name_only_what_the_code_has(doc):
    assert doc_problems(doc.read_text()) == []


def test_the_docs_check_catches_what_has_drifted():
    """The check itself, on text that names what the code lacks (so the test above can fail)."""
    text = ("```bash\nlensapp lens \"Hi\" --no-such-flag\nmake run HOSTNAME=x\nmake deploy\n"
            "lensapp serve --port 1 \\\n    --max-batch 4 --nonsense\n```\n"
            "Set `LENSAPP_NOPE=1`, call `api_name=\"/nope\"`, use `--frobnicate`. Four tabs:\n"
            "(`python -m lensapp.fitting` takes the same flags.)\n")
    problems = doc_problems(text)
    for bad in ("--no-such-flag", "HOSTNAME", "target deploy", "--nonsense", "LENSAPP_NOPE", "/nope",
                "--frobnicate", "'Four tabs'", "lensapp.fitting cannot be run"):
        assert any(bad in p for p in problems), (bad, problems)
    assert not [p for p in problems if p.endswith(("has no --max-batch", "has no --port"))]


def test_the_api_table_and_the_tabs_list_every_endpoint_and_tab():
    from lensapp import config
    from lensapp.ui.api import endpoints

    using = (ROOT / "docs" / "using.md").read_text()
    assert set(re.findall(r"^\| `/(\w+)`", using, re.M)) == {e.name for e in endpoints()}
    tabs = using.split("## The tabs", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^- \*\*", tabs, re.M)) == len(config.TABS)
    named = tabs.split(":\n", 1)[0]
    assert re.findall(r"`(\w+)`", named) == list(config.TABS)
    workshop = (ROOT / "docs" / "workshop.md").read_text()
    (shown,) = re.findall(r"# the tabs shown: (.*)$", workshop, re.M)
    assert shown.split(", ") == list(config.TABS)


def test_every_settings_table_is_the_config_s():
    from lensapp import config

    header = "| variable | flag | default | meaning |"
    for doc in TEXT_DOCS:
        text = doc.read_text()
        for start in [m.start() for m in re.finditer(re.escape(header), text)]:
            table = text[start:].split("\n\n", 1)[0].strip()
            assert table == config.settings_table(), f"{doc.name}: the settings table differs from config's"
