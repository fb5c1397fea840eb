"""The intervention kinds are a registry (service/intervening/registry.py): CONTRIBUTING's recipe "add an
intervention kind", followed once for real with a throwaway kind, on the tiny random Llama.

The kind, "echo", copies the prompt's first position's stream into its last, at each layer of a span, one
layer at a time. Adding it takes what the recipe says: a class with one decorator (its plan and its edits),
a description of what it did (an `InterventionDone`), and its name among the request field's choices; then
the service runs it, its cost is counted, and the API's JSON, the tab's summary and the CLI's text carry it
with no other edit. The lens at the edited layer then reads, at the last position, what it read at the first:
the edit was made where the plan said.

A kind sees the planner and the runner only through `kind.py`'s small types: no kind module (nor the registry,
nor `kind.py`) imports `planner.py` or `runner.py`, not even under `if TYPE_CHECKING:`, and the package's
modules import one another without a cycle.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import pytest

from lensapp.engine.run.edit import Edit
from lensapp.results import InterventionDone
from lensapp.service import InterveneRequest, cost, fields, kinds
from lensapp.service.intervening import KINDS, kind, plan, registry

# The request field's choices, with the new kind's name (in fields.py the kind is added to KIND itself).
ECHO_CHOICE = replace(fields.KIND, **fields.choosing("intervention", (*fields.KIND.choices, "echo")))


@dataclass(frozen=True)
class EchoRequest(InterveneRequest):
    intervention: str = ECHO_CHOICE.declared()


@dataclass(frozen=True)
class EchoDone(InterventionDone):
    kind: ClassVar[str] = "echo"


@dataclass(frozen=True)
class EchoPlan:
    positions: tuple[int, ...]          # the last position
    n_changes: int
    extra: cost.Cost
    words: tuple[str, ...] = ()


@pytest.fixture
def echo():
    @registry.intervention("echo")
    class Echo:
        """Echo: the first position's stream copied into the last, one layer of the span at a time."""

        def plan(self, req, reading, inputs) -> EchoPlan:
            return EchoPlan((len(reading.ids) - 1,), n_changes=len(reading.span),
                            extra=cost.forward(len(reading.ids)))          # the prompt's own streams, read first

        def carry_out(self, planned: kind.Planned[EchoPlan], run: kind.EngineCalls) -> kind.Changes:
            span = planned.reading.span
            kept = run.kept_streams(planned.reading.ids, span)              # [layers, positions, d_model]
            edits = [[Edit(layer, "replace", kept[i, :1], planned.change.positions)] for i, layer in enumerate(span)]
            return kind.Changes([f"echo at {layer}" for layer in span], [float(layer) for layer in span], edits,
                                EchoDone(**planned.described(), word=None))
    yield Echo
    del KINDS["echo"]


class _Guard:
    def api(self, request, fn, *args):
        return fn(*args)


def test_a_kind_added_by_the_recipe_runs_everywhere(tiny_service, echo):
    from lensapp.ui import api
    from lensapp.ui.intervene_tab import code_for, summarise

    req = EchoRequest.parse(prompt="The capital of France is", intervention="echo", layer="1-2")
    planned = plan(req, tiny_service.intervention_inputs())
    assert planned.change.positions == (4,) and planned.cost.forwards == 3 + 1     # before, two after, its read
    r = tiny_service.intervene(req)
    assert isinstance(r.intervention, EchoDone) and r.labels == ["echo at 1", "echo at 2"]
    logit = [x.lenses["logit"] for x in (r.before, *r.after)]
    for i, layer in enumerate((1, 2)):                            # the last position reads what the first did
        row = r.before.layers.index(layer)
        assert (logit[i + 1].top_ids[row, -1] == logit[0].top_ids[row, 0]).all()
        assert (logit[i + 1].top_ids[:row] == logit[0].top_ids[:row]).all()       # below the edit: untouched

    endpoint = kinds.Kind("intervene", EchoRequest, lambda service, request: service.intervene(request), "", "")
    answer = api.endpoint_function(endpoint, tiny_service, _Guard())(prompt="The capital of France is",
                                                                   intervention="echo", layer="1-2")
    assert answer["intervention"] == {"kind": "echo", "layers": [1, 2], "positions": "all",
                                      "changed_positions": [4], "lenses": ["logit"]}
    assert "kind=echo" in r.to_text() and summarise(r).startswith("**Echo** at layers 1, 2")
    assert code_for(tiny_service, r) == ""                        # no script for it: "Show the code" stays empty


def test_a_kind_is_registered_once_and_a_request_names_one_that_is():
    assert set(KINDS) == set(fields.KIND.choices) == set(fields.KIND.selects)
    with pytest.raises(ValueError, match="registered already"):
        registry.intervention("steer")(type("Again", (), {}))
    with pytest.raises(fields.RequestError, match="no intervention kind 'echo'"):
        registry.kind_of("echo")


PACKAGE = Path(kind.__file__).parent


def sibling_imports(path: Path) -> set[str]:
    """The modules of the package `path` imports (by file stem), `if TYPE_CHECKING:` and function bodies included."""
    package, out = registry.__package__, set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        else:
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            out.update((name + ".").removeprefix(package + ".").split(".")[0] or "__init__" for name in names
                       if name == package or name.startswith(package + "."))
    return out


def registers_a_kind(path: Path) -> bool:
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "intervention"
               for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) for d in n.decorator_list)


def test_a_kind_imports_neither_the_planner_nor_the_runner():
    kinds = sorted(p.stem for p in PACKAGE.glob("*.py") if registers_a_kind(p))
    assert kinds == sorted(KINDS)                                 # each kind in a module of its own, found here
    for stem in [*kinds, "registry", "kind"]:
        assert not sibling_imports(PACKAGE / f"{stem}.py") & {"planner", "runner", "__init__"}, stem


def test_the_package_imports_itself_without_a_cycle():
    graph = {p.stem: sibling_imports(p) - {"__init__"} for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(stem: str, path: tuple[str, ...]) -> None:
        assert stem not in path, f"an import cycle: {' -> '.join((*path, stem))}"
        if stem not in done:
            for imported in graph[stem]:
                visit(imported, (*path, stem))
            done.add(stem)

    for stem in graph:
        visit(stem, ())
