"""`lensapp space push` (lensapp/space.py), offline: the upload plan against this checkout, Docker's ignore rules,
the Hub's binary rule as huggingface_hub sends it the facts, and the push itself against a fake HfApi."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lensapp import cli, space

ROOT = Path(__file__).resolve().parents[1]


def front_matter(readme: bytes) -> dict:
    return yaml.safe_load(readme.decode().split("---\n", 2)[1])


@pytest.fixture(scope="module")
def cpu_plan():
    return space.plan("someone/lens-explorer")


def test_the_plan_is_every_tracked_file_a_docker_build_sees(cpu_plan):
    """What goes up is what `docker build .` gets here: tracked files less .dockerignore's; the image's own
    inputs are all there, and tests, benches and CI are not."""
    planned = {f.path for f in cpu_plan.files}
    patterns = space.dockerignore_patterns()
    tracked = space.tracked_files()
    assert planned == {p for p in tracked if not space.ignored(p, patterns)}
    needed = {"Dockerfile", "Makefile", "pyproject.toml", "README.md", "app.py", "requirements.txt",
              "requirements-gpu.txt", "scripts/check-prereqs.sh", "lensapp/assets/smollm2-135m-instruct_jlens.pt",
              "lensapp/nnsight.yaml", "docs/images/jacobian-tab.png"}
    assert needed <= planned, sorted(needed - planned)
    assert {p for p in tracked if p.startswith("lensapp/")} <= planned
    assert not [p for p in planned if p.split("/")[0] in ("tests", "bench", ".ci", ".venv", "artifacts")]


def test_sizes_and_xet_are_what_huggingface_hub_sends_the_hub(cpu_plan):
    """Each file's size and first 512 bytes, as huggingface_hub's CommitOperationAdd reads them (offline) for the
    Hub's preupload call: the lens and the screenshot go through Xet, every text file is a plain blob."""
    from huggingface_hub import CommitOperationAdd

    by_path = {f.path: f for f in cpu_plan.files}
    for f in cpu_plan.files:
        source = cpu_plan.readme if f.path == "README.md" else str(ROOT / f.path)
        info = CommitOperationAdd(f.path, source).upload_info
        assert f.size == info.size and f.mode == space.upload_mode(info.size, info.sample), f.path
    binary = {f.path for f in cpu_plan.files if f.mode == "xet"}
    assert binary == {"lensapp/assets/smollm2-135m-instruct_jlens.pt", "docs/images/jacobian-tab.png"}
    assert by_path["lensapp/assets/smollm2-135m-instruct_jlens.pt"].size > 15e6
    assert cpu_plan.total() == sum(f.size for f in cpu_plan.files) and cpu_plan.total("xet") > 0.9 * cpu_plan.total()


@pytest.mark.parametrize("size, sample, mode", [
    (0, b"", "regular"),                                       # empty files are always regular
    (100, b"print('hi')\n", "regular"),
    (11 * 1024 * 1024, b"a" * 512, "xet"),                     # over the Hub's 10 MB
    (2048, b"PK\x03\x04\x00" + b"a" * 507, "xet"),             # a NUL in the sample: binary
    (2048, b"a" * 512 + b"\x00", "regular"),                   # the Hub sees 512 bytes only
])
def test_the_hubs_binary_rule(size, sample, mode):
    assert space.upload_mode(size, sample) == mode


@pytest.mark.parametrize("path, pattern, out", [
    ("tests/test_x.py", "tests", True), ("tests", "tests", True), ("testsuite.py", "tests", False),
    ("lensapp/ui/__pycache__/a.pyc", "**/__pycache__", True), ("__pycache__/a.pyc", "**/__pycache__", True),
    ("x.egg-info/PKG-INFO", "*.egg-info", True), ("sub/x.egg-info/PKG-INFO", "*.egg-info", False),
    ("docs/a.md", "docs/*.md", True), ("docs/images/a.png", "docs/*.png", False), ("a/b/c.pt", "**/*.pt", True),
    ("a.pt", "[ab].pt", True), ("c.pt", "[ab].pt", False),
])
def test_docker_ignore_matching(path, pattern, out):
    """Docker's rules: a pattern is anchored at the context's root, `*` stays in one part, `**` spans parts, and
    a folder that matches takes its contents with it."""
    assert space.ignored(path, [pattern]) is out


def test_the_gpu_variant_sets_its_variables_and_suggests_a_gpu_that_holds_the_plan():
    gpu = space.plan("someone/lens-explorer-gpu", "gpu")
    assert gpu.variables == {"VARIANT": "gpu", "LENSAPP_MODEL": "Qwen/Qwen3-8B"}
    meta = front_matter(gpu.readme)
    assert meta["suggested_hardware"] == "l40sx1" == gpu.hardware
    assert meta["sdk"] == "docker" and meta["app_port"] == 7860
    # Only the front matter's hardware line differs from the README in the checkout.
    here = (ROOT / "README.md").read_bytes()
    assert gpu.readme.replace(b"suggested_hardware: l40sx1", b"suggested_hardware: cpu-upgrade") == here
    cpu = space.plan("someone/lens-explorer")
    assert cpu.variables == {"VARIANT": "cpu", "LENSAPP_MODEL": "embedded"} and cpu.readme == here


@pytest.mark.parametrize("argv, message", [
    (["space", "push", "nobody"], "space must be OWNER/NAME"),
    (["space", "push", "a/b c"], "space must be OWNER/NAME"),
])
def test_a_bad_space_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_dry_run_prints_the_plan_and_imports_nothing_of_the_app():
    """Through a subprocess, as `make space` runs it: the plan's files and totals, no upload, and neither torch,
    gradio, vLLM nor nnsight imported (a laptop that deploys need not have them)."""
    code = ("import runpy, sys; sys.argv = ['space', 'push', 'someone/x', '--dry-run']; rc = 0\n"
            "try: runpy.run_module('lensapp.space', run_name='__main__')\n"
            "except SystemExit as e: rc = e.code\n"
            "print(sorted(m for m in ('torch', 'gradio', 'vllm', 'nnsight') if m in sys.modules)); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "[]"
    assert lines[0].startswith("Space someone/x (cpu): ") and "VARIANT=cpu" in lines[1]
    assert any(line.split()[:1] == ["lensapp/assets/smollm2-135m-instruct_jlens.pt"] and line.endswith("xet")
               for line in lines)
    assert any(line.strip().startswith("through Xet: 2 files") for line in lines)


class FakeHub:
    """huggingface_hub.HfApi as far as `space.push` uses it, recording every call."""

    remote = ["README.md", ".gitattributes", "lensapp/gone.py"]

    def __init__(self):
        self.calls = []
        FakeHub.last = self

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def list_repo_files(self, repo_id, repo_type):
        return list(self.remote)

    def create_commit(self, repo_id, operations, **kw):
        self.calls.append(("create_commit", repo_id, operations, kw))
        return type("Commit", (), {"commit_url": f"https://huggingface.co/spaces/{repo_id}/commit/1"})()

    def add_space_variable(self, repo_id, key, value):
        self.calls.append(("variable", key, value))

    def request_space_hardware(self, repo_id, hardware):
        self.calls.append(("hardware", hardware))


def test_push_commits_the_plan_once_deletes_what_left_and_sets_the_variables(monkeypatch):
    import huggingface_hub
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    p = space.plan("someone/lens-explorer-gpu", "gpu")
    url = space.push(p, hardware="l40sx1")
    calls = FakeHub.last.calls
    assert url.endswith("/commit/1")
    assert calls[0] == ("create_repo", p.space, {"repo_type": "space", "space_sdk": "docker", "private": False,
                                                 "exist_ok": True})
    (_, _, operations, kw), = [c for c in calls if c[0] == "create_commit"]
    assert kw["repo_type"] == "space"
    adds = {op.path_in_repo: op for op in operations if isinstance(op, CommitOperationAdd)}
    assert set(adds) == {f.path for f in p.files}
    assert adds["README.md"].path_or_fileobj == p.readme
    assert [op.path_in_repo for op in operations if isinstance(op, CommitOperationDelete)] == ["lensapp/gone.py"]
    assert [c[1:] for c in calls if c[0] == "variable"] == list(p.variables.items())
    assert ("hardware", "l40sx1") in calls
    FakeHub.last.calls.clear()
    space.push(space.plan("someone/lens-explorer"))
    assert not [c for c in FakeHub.last.calls if c[0] == "hardware"]       # hardware only when asked (it is billed)


def test_the_docs_show_the_command_and_the_variables_the_plan_sets():
    hosting = (ROOT / "docs" / "hosting.md").read_text()
    assert "make space SPACE=" in hosting and "lensapp space push" in hosting
    for variables, hardware in space.VARIANTS.values():
        assert hardware in hosting
        for key, value in variables.items():
            assert f"{key}={value}" in hosting, f"{key}={value}"


def checkout(root: Path, files: dict[str, str]) -> Path:
    """A git checkout holding `files` (tracked, not committed: the plan reads what git tracks), a README with the
    Space's front matter and this repository's .dockerignore."""
    files = {"README.md": "---\nsdk: docker\nsuggested_hardware: cpu-upgrade\n---\n# x\n",
             ".dockerignore": (ROOT / ".dockerignore").read_text(), **files}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    return root


WORKSHOP = "title: T\nsettings:\n  rate_limit: 120\n  auth: \"host:s3cret-pw,alice:pw\"\nexercises: []\n"
HF_TOKEN = "hf_" + "Xy7" * 12                         # made here, so no file of this repository holds one
PEM = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.mark.parametrize("name, text, named", [
    ("workshops/room.yaml", WORKSHOP, "workshops/room.yaml (auth: a value)"),
    ("Dockerfile", "FROM python:3.11\nENV LENSAPP_AUTH=host:s3cret-pw\n", "Dockerfile (line 2: LENSAPP_AUTH=...)"),
    ("scripts/deploy.sh", f"export HF_TOKEN={HF_TOKEN}\n", "scripts/deploy.sh (line 1: a key (hf_...))"),
    ("lensapp/notes.py", f'"""{PEM}"""\n', "lensapp/notes.py (line 1: a private key)"),
], ids=["workshop-auth", "dockerfile-env", "hf-token", "private-key"])
def test_a_login_or_key_in_a_file_it_would_send_stops_the_push_in_one_line(tmp_path, name, text, named):
    """Before anything goes up (the plan is all `push` sends): one line naming the file and what is in it, never
    the secret itself, and the Space's secrets named as where it goes."""
    root = checkout(tmp_path, {name: text, "app.py": "print('hi')\n"})
    with pytest.raises(space.SpaceError) as e:
        space.plan("someone/lens-explorer", root=root)
    said = str(e.value)
    assert "\n" not in said and named in said and "Space's secrets" in said
    assert "s3cret" not in said and HF_TOKEN not in said and "b3Blbn" not in said


def test_what_is_not_sent_or_only_explains_a_secret_does_not_stop_it(tmp_path):
    root = checkout(tmp_path, {
        "tests/data/room.yaml": WORKSHOP,                                    # .dockerignore keeps tests out
        "docs/hosting.md": "Set a login (`LENSAPP_AUTH=alice:pw,bob:pw`) for a private session.\n",
        "lensapp/engine_service.py": '"""export LENSAPP_ENGINE_KEY=$(python -c "...")"""\n',
        "workshops/open.yaml": "title: T\nsettings: {rate_limit: 120, auth: ''}\nexercises: []\n",
        "Dockerfile": "ENV LENSAPP_ENGINE_KEY=$ENGINE_KEY\n",                # a variable of the build, not a value
    })
    planned = {f.path for f in space.plan("someone/lens-explorer", root=root).files}
    assert "workshops/open.yaml" in planned and "tests/data/room.yaml" not in planned
    with pytest.raises(space.SpaceError, match="tests/data/room.yaml"):     # sent when asked for: refused
        space.plan("someone/lens-explorer", root=root, with_dirs=("tests",))


def test_the_secrets_it_looks_for_are_the_apps():
    """space.py imports nothing of the app: its list of secret settings is checked against lensapp/settings.py."""

    from lensapp import config

    secret = [f.name for f in config.SETTING_FIELDS if not f.repr]
    assert sorted(space.SECRET_SETTINGS) == sorted(secret)
    for name in secret:
        assert space.secrets_in("Dockerfile", f"ENV {config.env_name(name)}=value") != [], name
        assert space.secrets_in("w.yml", f"settings: {{{name}: value}}") != [], name
