"""What a request costs the engine, counted before the engine sees it: every forward it makes, every cell it reads.

One cost model for every request kind (a lens, a comparison, a generation, an intervention's sweep, its
generations before and after, its multi-token targets, a patch's source):

    units = cells + tokens * token_weight

- `cells`: lens readouts, one per position, layer and lens (an unembedding over the whole vocabulary: the
  readout's main cost); an attention pattern's weights, PATTERN_WEIGHTS_PER_CELL to a cell;
- `tokens`: tokens pushed through the model, summed over every forward the request makes (a prompt's
  forward, each part a large readout is cut into, each multi-token target's continuation, each readout
  of a sweep, each generated token);
- `token_weight`: what one token's forward costs in cells, from the model's shape: its blocks' ~12 d^2
  multiply-adds per layer against the readout's d * vocab, at least 1 (4 for SmolLM2-135M, 13 for
  Qwen3-8B). An estimate of arithmetic, not a clock: the bench measures seconds.

`check` refuses a request whose units pass the budget (`max_work`) in one line that says what to reduce;
`deadline` gives a request its time: `request_timeout` for a light one, up to five times that for the
heaviest the budget allows, so a long legal request is never cancelled for being long.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.run import parts
from ..engine.run.protocol import LensSpec
from .field import RequestError


@dataclass(frozen=True)
class Cost:
    """forwards: separate engine requests (each a part with its own turn); tokens: tokens through the model;
    cells: lens readouts."""

    forwards: int = 0
    tokens: int = 0
    cells: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.forwards + other.forwards, self.tokens + other.tokens, self.cells + other.cells)

    def __mul__(self, n: int) -> Cost:
        return Cost(self.forwards * n, self.tokens * n, self.cells * n)

    def units(self, token_weight: int) -> int:
        return self.cells + self.tokens * token_weight


NOTHING = Cost()


def token_weight(n_layers: int, d_model: int, vocab_size: int) -> int:
    """A token's forward through the blocks in cells (see the module docstring): 12 d^2 n_layers / (d vocab)."""
    return max(1, round(12 * d_model * n_layers / max(1, vocab_size)))


def forward(n_tokens: int, n_layers: int = 0, n_lenses: int = 0, read_positions: int | None = None) -> Cost:
    """One forward over `n_tokens`, reading `read_positions` of them (all by default) at n_layers x n_lenses."""
    positions = n_tokens if read_positions is None else read_positions
    return Cost(1, n_tokens, positions * n_layers * n_lenses)


def readout(n_prompt: int, n_layers: int, n_lenses: int, continuations: list[int], max_part_cells: int,
            read_positions: int | None = None) -> Cost:
    """A prompt's lens readout, in as many parts as the engine cuts it into (each re-runs the prompt's forward:
    `engine/run/parts.py`), and one forward per multi-token target (`continuations`: each one's token count), which
    reads log P(target | prompt) at its own positions. read_positions: the last positions it unembeds (None: all;
    `LensSpec.read_from`)."""
    positions = n_prompt if read_positions is None else read_positions
    k = parts.n_parts(positions, n_layers, n_lenses, max_part_cells)
    cost = Cost(k, n_prompt * k, positions * n_layers * n_lenses)
    for m in continuations:
        cost = cost + forward(n_prompt + m - 1, n_layers, n_lenses, read_positions=m)
    return cost


def generation(spec: LensSpec, max_tokens: int, max_part_cells: int) -> Cost:
    """A generation of `spec` read at every step: its prompt's positions (read apart, in parts, when the engine
    does: `parts.prompt_read_apart`, the one rule both ask), then each new token."""
    n_prompt, n_layers, n_lenses = len(spec.input_ids), len(spec.layers), len(spec.lenses) + bool(spec.after_attention)
    steps = Cost(1, n_prompt + max_tokens, max_tokens * n_layers * n_lenses)
    if not parts.prompt_read_apart(spec, max_part_cells):
        return steps + Cost(0, 0, n_prompt * n_layers * n_lenses)
    return steps + readout(n_prompt, n_layers, n_lenses, [], max_part_cells)


def chat(n_prompt: int, max_tokens: int) -> Cost:
    """A chat reply (service/generating.py): the conversation's forward and each new token, one cell a step (the
    newest token at one layer, through one lens)."""
    return Cost(1, n_prompt + max_tokens, max_tokens)


def last_positions(prompt_lengths: list[int], n_layers: int, n_lenses: int, max_part_cells: int) -> Cost:
    """An evaluation (service/evaluating.py): one forward per prompt (or per part, where the engine cuts one
    position's layers: `parts.n_parts`), each reading its last position only (`LensSpec.read_from`) at
    n_layers x n_lenses, so items x layers x lenses cells in all, whatever the prompts' lengths (their tokens still
    go through the model)."""
    k = parts.n_parts(1, n_layers, n_lenses, max_part_cells)
    return sum((Cost(k, n * k, n_layers * n_lenses) for n in prompt_lengths), NOTHING)


# A layer's attention pattern is heads x positions^2 weights, each computed, returned and drawn: this many of
# them count as one cell (a cell returns its top-k and three scores, and draws one mark).
PATTERN_WEIGHTS_PER_CELL = 64


def components(n_prompt: int, n_heads: int = 0, pattern_positions: int = 0) -> Cost:
    """A components readout (service/components.py): one forward over the prompt, whose reads at one position
    are a few vectors per layer (one cell: two unembedding rows), and, when asked, one layer's attention
    pattern among `pattern_positions` positions (O(heads x positions^2): PATTERN_WEIGHTS_PER_CELL to a cell)."""
    weights = n_heads * pattern_positions ** 2
    return Cost(1, n_prompt, 1 + -(-weights // PATTERN_WEIGHTS_PER_CELL))


ADVICE = "choose fewer layers, one lens, fewer targets or changes, or a shorter prompt"


def check(cost: Cost, weight: int, max_work: int, what: str, advice: str = ADVICE) -> None:
    """RequestError, in one line saying what to reduce (`advice`), when `cost` passes the budget."""
    units = cost.units(weight)
    if units > max_work:
        forwards = f" in {cost.forwards} forwards" if cost.forwards > 1 else ""
        raise RequestError(f"{what} costs {units:,} units of work ({cost.cells:,} cells read and {cost.tokens:,} "
                           f"tokens through the model{forwards}); the limit is {max_work:,}: {advice}")


DEADLINE_SPREAD = 4.0      # the heaviest request the budget allows gets 1 + this many request_timeouts


def deadline(cost: Cost, weight: int, max_work: int, request_timeout: float) -> float:
    """Seconds a request of this cost may take: request_timeout, and up to DEADLINE_SPREAD times as much again in
    proportion to its share of the budget. Generous on purpose: a deadline cancels one request that runs away
    (the watchdog restarts a stuck engine), and a crowded CPU stretches every legal request alike."""
    share = min(1.0, cost.units(weight) / max(1, max_work))
    return request_timeout * (1.0 + DEADLINE_SPREAD * share)


def branch(n_prefix: int, n_new: int, n_layers: int, n_lenses: int) -> Cost:
    """A branch's continuation (service/branching.py): one forward over its prefix (the prompt, the tokens kept
    and the forced one) and `n_new` new tokens, reading only the forced token's position and each new one: the
    prefix's other positions were read by the generation it branches from."""
    if n_new <= 0:
        return NOTHING
    return Cost(1, n_prefix + n_new, n_new * n_layers * n_lenses)


def fit(n_prompt: int, steps: int) -> Cost:
    """A fitted steering vector (fitting/steering.py), at most: `steps` optimiser steps, each a forward and a backward
    (about twice a forward) of the prompt, on the fitter's own copy of the model (no engine request). It is spent
    from the asker's budget when the fit starts (a fit already made or under way costs nothing); the fit's own
    bounds (steps, seconds, one at a time) stand in for the budget check."""
    return Cost(0, 3 * n_prompt * steps, 0)


def description(n_prompt: int, n_inspect: int, n_described: int, n_tokens: int) -> Cost:
    """Patchscopes (service/describing.py): the prompt's forward keeping its states (one layer read at its
    positions), then one greedy generation of the inspection prompt per described layer (one cell a step)."""
    return Cost(1, n_prompt, n_prompt) + Cost(1, n_inspect + n_tokens, n_tokens) * n_described
