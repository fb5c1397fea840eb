"""Every field a request may carry, declared once: its name, help, default, parser, and how it shows on each surface.

The request classes (`requests.py`) list these in their published order; the API's endpoints, the CLI's
arguments, the permalink codec and the tabs are made from those lists (`kinds.py`), and every surface reads
a value with the field's one parser. So a value gets the same answer wherever it comes from: a link, the
API, the command line or a form. What a field is: `field.py`; the parsers: `parsers.py`. Nothing here needs
a model: layers and positions are resolved against one when the service plans a request.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import (
    MAX_ALPHA,
    MAX_DESCRIBE_TOKENS,
    MAX_FORCES,
    MAX_GENERATE_TOKENS,
    MAX_K,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MAX_SWEEP,
    MAX_TARGET_CHARS,
    MAX_TEMPERATURE,
    PUNCTUATION_WIDTH,
)
from ..lens_kinds import LENSES, readings
from .evaluation_items import SHIPPED, SPLITS
from .field import REQUIRED, Field, RequestError, fields_of, show
from .parsers import (
    choice,
    flag,
    forces,
    indices,
    layers,
    messages,
    number,
    numbers,
    optional_whole,
    prompts,
    targets,
    text,
    whole,
)


def choosing(what: str, options: tuple[str, ...], say: str | None = None) -> dict:
    """A choice field's parser and choices, from one list of options."""
    return {"parse": choice(what, options, say), "choices": options}


def spoken(options) -> str:
    """'a, b or c'."""
    options = list(options)
    return ", ".join(options[:-1]) + " or " + options[-1] if len(options) > 1 else options[0]


PROMPT = Field("prompt", "the text to read", "", text("the prompt", MAX_PROMPT_CHARS), required=True,
               api=(str, REQUIRED), label="Prompt")
PROMPTS = Field("prompts", "the prompts, read together the same way", (), prompts, required=True,
                api=(list[str], REQUIRED), label="Prompt")
# The lenses' choices and help are made from the declared lenses (lens_kinds.py): a new lens is one of them.
LENS = Field("lens", " | ".join(readings()) + " (with both and layers=all: the Jacobian lens's layers)", "logit",
             **choosing("lens", tuple(readings()), spoken(readings())), flag="--lens", label="Lens")
LAYERS = Field("layers", "all | L,L,... | A-B (negative counts from the end)", "all", layers, flag="--layers",
               label="Layers (all, 10-20 or 0,5,-1)")
K = Field("k", f"top-k tokens per cell (1..{MAX_K})", 5, whole("k", 1, MAX_K), flag="--k", label="Top-k")
TARGETS = Field("targets", "words to score at every cell (comma-separated)", (), targets, flag="--target",
                api=(str, ""), label="Target word(s), comma-separated (optional)")
CHAT = Field("chat", "wrap the prompt in the tokenizer's chat template (instruct models)", False, flag("chat"),
             flag="--chat", label="Wrap in the chat template (instruct models)")
SKIP_PUNCTUATION = Field("skip_punctuation", "each cell shows the best of the top "
                         f"{PUNCTUATION_WIDTH} tokens that is not punctuation or whitespace, with its rank (the "
                         "top-k stays the true one)", False, flag("skip_punctuation"), flag="--skip-punctuation",
                         label="Skip punctuation and whitespace")
RAW = Field("raw", "raw logits: norm(h) @ W_U.T, skipping the family's logit arithmetic (soft-capping, scale)",
            False, flag("raw"), flag="--raw", label="Raw logits")
MAX_TOKENS = Field("max_tokens", f"tokens to generate (1..{MAX_GENERATE_TOKENS})", 8,
                   whole("max_tokens", 1, MAX_GENERATE_TOKENS), flag="--max-tokens", label="Max new tokens")
TEMPERATURE = Field("temperature", f"0 = greedy, up to {MAX_TEMPERATURE:g}", 0.0,
                    number("temperature", 0.0, MAX_TEMPERATURE), flag="--temperature",
                    label="Temperature (0 = greedy)")
SEED = Field("seed", "sampling seed: the same seed gives the same text (none: a fresh sample each time)", None,
             optional_whole("seed", 0, MAX_SEED), flag="--seed", api=(int | None, None),
             label="Seed (sampling: the same seed gives the same text)")
MESSAGES = Field("messages", "the conversation: [{role, content}, ...], ending with the user's", (), messages,
                 required=True, api=(list[dict], REQUIRED))
CHAT_LENS = Field("lens", "the readout's lens: " + " | ".join(reversed(LENSES)), "jacobian",
                  **choosing("the chat readout", tuple(LENSES), "one lens, " + spoken(LENSES)),
                  label="Readout lens")
CHAT_LAYER = Field("layer", "the readout's layer (negative counts from the end; none: about two thirds of the depth)",
                   None, optional_whole("the chat layer", -(1 << 20), 1 << 20), api=(int | None, None),
                   label="Readout layer")
CHAT_MAX_TOKENS = replace(MAX_TOKENS, default=32)
CHAT_K = replace(K, default=3)

SUBLAYERS = Field("sublayers", "also read each layer between its attention and its MLP (logit lens): rows L.attn, the "
                  "residual after the attention, beside L.mlp, after the MLP (the layer's usual row)", False,
                  flag("sublayers"), flag="--sublayers", label="Inside each layer")

# -- interventions (service/intervening/) -------------------------------------------------------------

# On the command line the intervention's kind is whichever of --steer WORD, --ablate WORD or --patch-from SOURCE
# is given (`selects`), so neither the kind nor the word nor the source has an argument of its own.
KIND = Field("intervention", "steer (add a direction), ablate (remove it) or patch (copy cells from a source prompt)",
             "steer", **choosing("intervention", ("steer", "ablate", "patch")), cli=False, label="Intervention",
             selects={"steer": ("--steer", "word"), "ablate": ("--ablate", "word"),
                      "patch": ("--patch-from", "source")})
WORD = Field("word", "the word whose direction is added (steer) or removed (ablate)", "",
             text("the word", MAX_TARGET_CHARS, empty_ok=True), cli=False,
             label="Word (steer toward it, or ablate it)")
FROM_WORD = Field("from_word", "steer from this word toward `word`: the difference of their directions", "",
                  text("the from word", MAX_TARGET_CHARS, empty_ok=True), flag="--from",
                  label="From word (steer from it to the word; optional)")
DIRECTION = Field("direction", "a word's logit-lens direction (its unembedding row through the final norm's scale), "
                  "its Jacobian-lens direction (J_l^T of that), or a vector fitted to make the lens read it",
                  "logit", **choosing("direction", ("logit", "jacobian", "fitted")), flag="--direction",
                  label="Direction")
OBJECTIVE = Field("objective", "what a fitted vector must make read the word: the lens at its layer, or the output",
                  "output", **choosing("objective", ("lens", "output")), flag="--objective",
                  label="Fitted: make read the word by")
SPAN = Field("layer", "the layer, or a span of layers (L-L2), whose output is changed", "",
             indices("layer"), flag="--layer", required=True, api=(str, ""), label="Layer or span (L or L-L2)")
# The sweep a steering request makes when it names no alphas (service/intervening/steer.py, `sweep`): these, or
# for a fitted vector these multiples of its own length.
DEFAULT_ALPHAS = (0.0, 0.1, 0.2, 0.4, 0.8)
FITTED_MULTIPLES = (0.0, 0.5, 1.0, 2.0)
ALPHAS = Field("alphas", "steering strengths: the added vector's length in units of the layer's typical residual norm "
               f"(comma-separated, up to {MAX_SWEEP}: a dose-response sweep; empty: 0, 0.1, 0.2, 0.4, 0.8, and for a "
               "fitted vector 0, 1/2, 1 and 2 times its own length)", (),
               numbers("alpha", -MAX_ALPHA, MAX_ALPHA, MAX_SWEEP, empty_ok=True), flag="--alpha", api=(str, ""),
               label="Alphas (steer: × the layer's typical norm; a sweep; empty: the default)")
POSITIONS = Field("positions", "the prompt positions changed: all, P, P-P2 (negative counts from the end)", "all",
                  indices("positions"), flag="--position", label="Positions changed (all, P or P-P2; -1 is the last)")
PROMPT_ONLY = Field("prompt_only", "steer the prompt only, not the tokens a generation adds", False,
                    flag("prompt_only"), flag="--prompt-only", label="Steer the prompt only, not generated tokens")
ABLATION = Field("ablation", "remove the component along the direction (project), or set it to its mean over a "
                 "reference text (mean)", "project", **choosing("ablation", ("project", "mean")), flag="--ablation",
                 label="Ablation")
REFERENCE = Field("reference", "the text whose mean a mean ablation uses (empty: a paragraph of general English)", "",
                  text("the reference", MAX_PROMPT_CHARS, empty_ok=True), flag="--reference",
                  label="Mean ablation: reference text (empty: a built-in paragraph)")
SOURCE = Field("source", "patch: the prompt whose cells are copied", "",
               text("the source prompt", MAX_PROMPT_CHARS, empty_ok=True), cli=False,
               label="Patch: source prompt (its cells are copied in)")
SOURCE_POSITIONS = Field("source_positions", "patch: the source's positions (empty: as many as the target's, aligned "
                         "at the end)", "", lambda raw: "" if isinstance(raw, str) and not raw.strip()
                         else indices("source_positions")(raw), flag="--source-position",
                         label="Patch: source positions (empty: aligned at the end)")
# Both generations, before and after, sample with one seed (service/intervening/runner.py, `generation_seed`).
INTERVENE_SEED = replace(SEED, help="the sampling seed of the texts generated before and after (one seed for both; "
                         "none: 0)")
NEW_TOKENS = Field("new_tokens", f"tokens to generate with and without the intervention (0..{MAX_GENERATE_TOKENS}: "
                   "none)", 0, whole("new_tokens", 0, MAX_GENERATE_TOKENS), flag="--max-tokens",
                   label="Generate this many tokens before and after (0: none)")

# -- components (service/components.py) ------------------------------------------------------------------

TARGET = Field("target", "the word whose logit is explained (its first token, as it would follow the prompt)", "",
               text("the target", MAX_TARGET_CHARS), flag="--target", required=True, api=(str, REQUIRED),
               label="Target word (its first token)")
FOIL = Field("foil", "explain the target's logit minus this word's (its first token); empty: the target's alone", "",
             text("the foil", MAX_TARGET_CHARS, empty_ok=True), flag="--foil",
             label="Foil word (optional: target minus foil)")
POSITION = Field("position", "the position whose next-token logit is explained (negative counts from the end)", -1,
                 whole("position", -(1 << 20), 1 << 20), flag="--position", label="Position (-1: the last)")
PATTERNS = Field("patterns", "also this layer's attention weights from the position to every earlier one "
                 "(negative counts from the end; empty: none)", None,
                 optional_whole("the patterns layer", -(1 << 20), 1 << 20), flag="--patterns", api=(int | None, None),
                 label="Attention pattern of layer (-1: the last; empty: none)")


__all__ = ["Field", "RequestError", "fields_of", "show"]


# -- the road not taken: forcing a token, describing a cell (issue 28) ------------------------------------

FORCE = Field("force", "put a token in place of the one generated at STEP (counted from 0) and generate on from it, "
              "with the same settings and seed: STEP=WORD (the word's first token as the model would write it after "
              "the text there; a leading space is kept as typed) or STEP=#ID; several, earliest first, branch a "
              "branch", (),
              forces(MAX_FORCES, MAX_GENERATE_TOKENS - 1), flag="--force", api=(list[str], []))
DESCRIBE_LAYER = Field("layer", "the block whose output is described: L (negative counts from the end), a list, a "
                       "range or all (one description per layer, run together)", "", indices("layer"), flag="--layer",
                       required=True, api=(str, REQUIRED))
DESCRIBE_POSITION = Field("position", "the prompt position whose state is described (negative counts from the end)",
                          -1, whole("position", -(1 << 20), 1 << 20), flag="--position")
DESCRIBE_TOKENS = Field("max_tokens", f"tokens of the description, greedy (1..{MAX_DESCRIBE_TOKENS})", 8,
                        whole("max_tokens", 1, MAX_DESCRIBE_TOKENS), flag="--max-tokens")
INSPECT = Field("inspect", "the inspection prompt, whose last token is the placeholder the state replaces (empty: "
                "the identity prompt 'cat -> cat; 1135 -> 1135; hello -> hello; ?')", "",
                text("the inspection prompt", MAX_PROMPT_CHARS, empty_ok=True), flag="--inspect")
INSPECT_LAYER = Field("inspect_layer", "the block of the inspection prompt whose output takes the state (negative "
                      "counts from the end; none: the described layer itself)", None,
                      optional_whole("inspect_layer", -(1 << 20), 1 << 20), flag="--inspect-layer",
                      api=(int | None, None))


# -- how good is a lens: evaluation items (issue 40) -------------------------------------------------------

EVAL_ITEMS = Field("items", f"the items: a shipped set ({', '.join(SHIPPED)}) or, on the command line, a file of the "
                   "published form {\"items\": [{name, prompt, target, intermediates}]}", "two_hop",
                   text("items", 4096), flag="--items", label="Items")
EVAL_SPLIT = Field("split", "which items: heldout (the half never tuned against), dev or all", "heldout",
                   **choosing("split", SPLITS, "heldout, dev or all"), flag="--split", label="Items to score")
