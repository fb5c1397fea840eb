"""A request cut into parts: engine requests small enough that nobody waits long behind one.

vLLM runs every request in flight in one step, and a step lasts as long as the work inside it: a
readout of a 500-token prompt at every layer is ~15,000 unembeddings in one forward, seconds on a
CPU, and whoever else is in that step waits for it. So a readout larger than `max_cells` (positions x
layers x lenses) is cut by layers into parts that each re-run the prompt's forward and read some of
its layers; the engine runs them as separate requests, taking turns with everyone else's (`turns`).
A generation reads its prompt apart, in such parts, and its own request reads only the new tokens,
a few cells a step. Every readout field is laid out [layers, positions, ...], so the parts' readouts
concatenate back into exactly what one request would have read (the same forward, the same edits).

Pure functions of specs and outputs, and `Part`: one engine request as the engine runs it (a call on
whichever backend is up, and the cells it reads). No backend, no engine.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Awaitable, Callable, NamedTuple

import torch

from .protocol import Backend, GenerationOutput, LensOutput, LensSpec, Sampling


def big_cells(max_cells: int) -> int:
    """Cells from which a part is *big*: the engine runs one big part at a time (`turns.FairSlots`), and reads a
    generation's prompt apart when that readout is big, so a generation never holds the big turn for its steps."""
    return max(1, max_cells // 4)


def prompt_read_apart(spec: LensSpec, max_cells: int) -> bool:
    """Whether a generation of `spec` reads its prompt apart, in lens parts (`split_generation`): when it reads its
    whole prompt at step 0 and those cells (`cells`: the layers it reads, the last among them) are big, so the
    generation's own request, many steps long, never holds the big turn. The one rule: the engine cuts by it and
    the cost model counts by it (`service/cost.py`)."""
    return spec.read_prompt and not spec.read_from and cells(spec, generation=True) >= big_cells(max_cells)


def layers_per_part(n_positions: int, n_lenses: int, max_cells: int) -> int:
    """How many layers one part reads: at least one, at most max_cells // (positions x lenses)."""
    return max(1, max_cells // max(1, n_positions * n_lenses))


def n_parts(n_positions: int, n_layers: int, n_lenses: int, max_cells: int) -> int:
    """How many parts a readout of this size is cut into (1: not cut)."""
    return math.ceil(n_layers / layers_per_part(n_positions, n_lenses, max_cells))


def read_positions(spec: LensSpec) -> int:
    """The prompt positions a lens readout of `spec` unembeds: from `read_from` on."""
    return len(spec.input_ids) - spec.read_from


def cells(spec: LensSpec, generation: bool = False) -> int:
    """The cells the heaviest step of `spec`'s engine request reads (positions x read layers x lenses): a lens
    reads its prompt's positions from `read_from`; a generation reads them at step 0 if `read_prompt`, then one
    position a step."""
    positions = read_positions(spec)
    if generation and not spec.read_prompt:
        positions = 1
    return max(1, positions) * len(spec.read_layers) * (len(spec.lenses) + bool(spec.after_attention))


def split_lens(spec: LensSpec, max_cells: int) -> list[LensSpec]:
    """`spec` as parts reading consecutive groups of its layers (the first part keeps its continuations);
    [spec] when it is small enough, or when it keeps streams or measures norms (read in one forward)."""
    layers = spec.layers
    group = layers_per_part(read_positions(spec), len(spec.lenses) + bool(spec.after_attention), max_cells)
    if len(layers) <= group or spec.keep_layers or spec.norms:
        return [spec]
    parts = []
    for start in range(0, len(layers), group):
        chunk = layers[start:start + group]
        read = sorted(set(chunk) | {spec.read_layers[-1]})          # the last layer: the final distribution
        jrows = None if spec.jlens_rows is None else spec.jlens_rows[start:start + group]
        parts.append(dataclasses.replace(spec, read_layers=tuple(read), rows=tuple(read.index(x) for x in chunk),
                                         jlens_rows=jrows, continuations=spec.continuations if not parts else ()))
    return parts


def merge_lens(parts: list[LensOutput]) -> LensOutput:
    """The parts' outputs as the one output of the spec they were cut from."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    readouts = {lens: {field: torch.cat([p.readouts[lens][field] for p in parts]) for field in fields}
                for lens, fields in first.readouts.items()}
    between = None
    if first.after_attention is not None:         # read at the same layers as the readouts: the same cut
        between = {lens: {field: torch.cat([p.after_attention[lens][field] for p in parts]) for field in fields}
                   for lens, fields in first.after_attention.items()}
    return dataclasses.replace(first, readouts=readouts, after_attention=between)


def split_generation(spec: LensSpec, max_cells: int) -> tuple[list[LensSpec], LensSpec]:
    """(the prompt's readout as lens parts, the generation reading only its new tokens), when `prompt_read_apart`;
    ([], spec) when not (a small readout, no prompt read, or only its last positions: `read_from`, as a branch's
    continuation reads the one token it forced)."""
    if not prompt_read_apart(spec, max_cells):
        return [], spec
    prompt = dataclasses.replace(spec, continuations=(), keep_layers=(), keep_positions=None, norms=False)
    return split_lens(prompt, max_cells), dataclasses.replace(spec, read_prompt=False)


def merge_generation(prompt: list[LensOutput], generation: GenerationOutput) -> GenerationOutput:
    """The generation with its step 0 (every prompt position) read from the prompt's parts, if it was cut."""
    steps = list(generation.steps)
    if prompt and steps:
        steps[0] = merge_lens(prompt).readouts
    return dataclasses.replace(generation, steps=steps)


class Part(NamedTuple):
    """One engine request: `run(backend)`, and the cells its heaviest step reads (big or small in `FairSlots`)."""
    run: Callable[[Backend], Awaitable]
    cells: int = 0
    brief: bool = False           # done in one engine step (a lens), not in many (a generation)


def lens_part(spec: LensSpec) -> Part:
    return Part(lambda backend: backend.run_lens(spec), cells(spec), brief=True)


def generate_part(spec: LensSpec, sampling: Sampling) -> Part:
    return Part(lambda backend: backend.run_generate(spec, sampling), cells(spec, generation=True))
