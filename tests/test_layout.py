"""The architecture holds: imports point one way, both backends implement the protocol, modules stay small."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lensapp"

# What each layer must not import (a prefix matches the module and everything under it).
FORBIDDEN = {
    "lensapp.engine": ("lensapp.service", "lensapp.results", "lensapp.charts", "lensapp.ui", "lensapp.cli",
                       "lensapp.server", "gradio", "altair"),
    "lensapp.lenses": ("lensapp.", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.interventions": ("lensapp.", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.jlens": ("lensapp.engine", "lensapp.service", "lensapp.ui", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.results": ("lensapp.service", "lensapp.ui", "lensapp.charts", "gradio", "altair", "vllm", "nnsight"),
    "lensapp.charts": ("lensapp.service", "lensapp.engine", "lensapp.ui", "torch", "gradio", "vllm", "nnsight"),
    "lensapp.service": ("lensapp.ui", "lensapp.charts", "lensapp.cli", "lensapp.server", "gradio", "altair"),
    "lensapp.fitting": ("lensapp.service", "lensapp.ui", "lensapp.cli", "gradio", "altair"),
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


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_modules_stay_readable(path):
    assert len(path.read_text().splitlines()) <= 420, f"{module_name(path)} has outgrown one noun"


def test_both_backends_implement_the_protocol():
    from lensapp.engine.hf_backend import TransformersBackend
    from lensapp.engine.protocol import Backend
    from lensapp.engine.vllm_backend import VLLMBackend

    methods = {n: m for n, m in vars(Backend).items() if inspect.isfunction(m) and not n.startswith("_")}
    assert set(methods) >= {"install_jlens", "run_lens", "run_generate", "run_chat", "failure", "close"}
    for cls in (VLLMBackend, TransformersBackend):
        for name, proto in methods.items():
            impl = getattr(cls, name, None)
            assert impl is not None, f"{cls.__name__} lacks {name}"
            assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(proto), f"{cls.__name__}.{name}"
            assert list(inspect.signature(impl).parameters) == list(inspect.signature(proto).parameters), \
                f"{cls.__name__}.{name}{inspect.signature(impl)} differs from the protocol's {inspect.signature(proto)}"
