"""Text in, results out: what the CLI, the API and the tabs call.

`LensService` turns a request (text, settings) into the engine's `LensSpec`s (tokenising,
chat templates, targets, layer defaults, the work budget), runs them through the engine, and
builds `results` objects from the tensors that come back. It owns the Jacobian lens (loaded and
checked against the model here, installed in the engine, which re-installs it after a restart)
and the result cache. It knows nothing of Gradio or charts.

Each request kind is planned and run in a module of its own (reading.py, generating.py, branching.py,
describing.py, components.py, evaluating.py, intervening/), through the service's public face only: the
model's `info`, `prompts` and `engine`, the budget (`check_cost`, `admitted`, `deadline`) and the result cache
(`cached`, `cached_many`). Who asks travels beside the request as a value (`asks.Ask`): each entry takes one
(given none, the one its handler was called with: `asks.asked`) and hands it to those modules, which hand its
client to the engine, its payer to `admitted` (the engine calls run inside it: what the engine refuses is given
back, a stopped generation keeps only its steps) and its wish to be kept to the cache.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import Callable, Iterator, TypeVar

from .. import jlens as jlens_files
from ..config import MAX_COMPARE_PROMPTS, Config, requests_at_once
from ..engine.run.core import Engine
from ..engine.run.protocol import Backend, Sampling
from ..engine.start.host import memory_in_use
from ..engine.start.loading import ResolvedModel, backend_factory, describe_model
from ..engine.start.memory import Budget, fitting_on
from ..engine.start.preflight import preflight
from ..lens_kinds import LENSES, LOGIT, lens, reads_jlens
from ..results import ChatReply, Comparison, ComponentsResult, GenerationResult, InterventionResult, LensResult
from ..results.description import Descriptions
from . import components, cost, evaluating, planning
from .app_jlens import engine_stack, lens_key, load_configured_jlens, load_jlens
from .asks import HOST, Ask, Receipt, asked
from .branching import Brancher
from .cache import ResultCache
from .describing import Describer
from .field import RequestError
from .fits import FitDesk
from .generating import Generator
from .intervening import Inputs, Intervener, Jacobians, Limits
from .prompts import Prompts, load_tokenizer
from .reading import Reader
from .requests import ChatRequest, ComponentsRequest, DescribeRequest, GenerateRequest, InterveneRequest, LensRequest

log = logging.getLogger(__name__)
T = TypeVar("T")


class LensService:
    def __init__(self, model: ResolvedModel, engine: Engine, prompts: Prompts, cfg: Config,
                 jlens: jlens_files.JacobianLens | None = None, jlens_error: str | None = None):
        self.model, self.engine, self.prompts, self.cfg = model, engine, prompts, cfg
        self.info = model.info
        self.jlens, self.jlens_error = jlens, jlens_error
        self._jlens_key = lens_key(jlens)
        prompts.bos = _reads_with_bos(jlens)
        self.cache = ResultCache(cfg.web.cache_entries, cfg.web.cache_mb << 20)
        self.budget: Budget | None = None        # the memory plan checked at start (engine/start/memory.py)
        self.token_weight = cost.token_weight(model.info.n_layers, model.info.d_model, model.info.vocab_size)
        # fitted steering vectors: one at a time, in their own process
        self.fits = FitDesk(cfg.fits, cfg.limits.fit_queue, cfg.engine, has_login=bool(cfg.secrets.auth_pairs))
        self.intervener = Intervener(engine, model.path, model.family)
        self.reader = Reader(self)               # lens readouts
        self.generator = Generator(self)         # generations and chat replies
        self.brancher = Brancher(self, self.generator)      # forced tokens: their branches
        self.describer = Describer(self)         # Patchscopes: a cell described in words
        # Told of each request asked for: observer(kind, request), kind one of lens, compare, generate, chat,
        # intervene, components (a workshop's counts: usage.py). Never told twice of one request; its errors are logged.
        self.observer: Callable[[str, object], None] | None = None

    @classmethod
    def start(cls, cfg: Config, start_engine: bool = True) -> LensService:
        """Read the model's config, load its tokenizer and Jacobian lens, and start the engine (in the
        background: `wait_ready` or any request waits for it). Bad settings fail here, before any engine.
        With start_engine=False the engine starts at the first request (the CLI checks its input first)."""
        model = describe_model(cfg.engine, cfg.limits, cfg.remote)
        prompts = Prompts(load_tokenizer(model.path), model.max_prompt_tokens)
        lens, error = load_configured_jlens(cfg.engine, model)
        budget = preflight(cfg, model, 0 if lens is None else len(lens.layers))
        limits = cfg.limits
        engine = Engine(backend_factory(model, cfg.engine, limits, cfg.remote, cfg.secrets.engine_key), model.info,
                        warm_up=functools.partial(warm_up, prompts, model.info), jlens=engine_stack(lens, model),
                        max_batch=requests_at_once(cfg), queue_size=limits.queue_size,
                        request_timeout=limits.request_timeout, stall_timeout=limits.stall_timeout,
                        per_client=limits.client_requests, parts_per_client=limits.client_parts,
                        max_part_cells=limits.part_cells)
        if start_engine:
            engine.start()
        service = cls(model, engine, prompts, cfg, lens, error)
        service.budget = budget
        if fitting_on(cfg.fits) and not budget.fitter:        # preflight took the fitter out of a plan it did not fit
            service.fits.off_reason = ("this machine's memory holds the app but not also the fitter's copy of the "
                                       "model")
        return service

    # -- the Jacobian lens ---------------------------------------------------------------------------
    @property
    def jlens_layers(self) -> list[int]:
        """The layers the J-lens reads: the lens's own, plus the last (J = I there, as published lenses do)."""
        return [] if self.jlens is None else self.jlens.layers + [self.info.n_layers - 1]

    def load_jlens(self, spec: str) -> jlens_files.JacobianLens:
        """Load a lens file (path or HUB_REPO:FILE), check it against the model and use it from now on."""
        lens = load_jlens(spec, self.model, self.cfg.engine)
        self.install_jlens(lens)
        return lens

    def install_jlens(self, lens: jlens_files.JacobianLens | None) -> None:
        """Use `lens` from now on (None: none), every prompt read as it was fitted (BOS first or not: prompts.py).
        Cached results of another lens are never served for it."""
        self.jlens, self._jlens_key = lens, lens_key(lens)
        self.prompts.bos = _reads_with_bos(lens)
        stack = engine_stack(lens, self.model)
        if stack is not None:
            self.engine.set_jlens(stack)

    # -- requests ------------------------------------------------------------------------------------
    def lens(self, req: LensRequest, max_prompts: int = MAX_COMPARE_PROMPTS, read_from: int = 0,
             ask: Ask | None = None) -> list[LensResult]:
        """Every requested lens, layer and position for each prompt; the prompts run together. read_from: one
        prompt's positions from there on only, the rest blank (`Reader.read`: a page's first look). `ask`: who
        asks (asks.py), as every entry below takes it."""
        ask = self._observe("lens", req, ask)
        return self.reader.read(req, max_prompts, read_from, ask)

    def compare(self, req: LensRequest, ask: Ask | None = None) -> Comparison:
        """2..MAX_COMPARE_PROMPTS prompts read the same way, in flight together; each prompt's result is
        exactly what `lens` gives for it alone."""
        if not 2 <= len(req.prompts) <= MAX_COMPARE_PROMPTS:
            raise RequestError(f"compare takes 2 to {MAX_COMPARE_PROMPTS} prompts; got {len(req.prompts)}")
        ask = self._observe("compare", req, ask)
        return Comparison(self.reader.read(req, MAX_COMPARE_PROMPTS, ask=ask))

    def generate(self, req: GenerateRequest, ask: Ask | None = None) -> GenerationResult:
        """Generate and read the newest position at every step (step 0: all prompt positions); with `force`, the
        branch those tokens make (service/branching.py)."""
        ask = self._observe("generate", req, ask)
        return self.brancher.generate(req, ask) if req.force else self.generator.generate(req, ask)

    def generate_stream(self, req: GenerateRequest, ask: Ask | None = None) -> Iterator:
        """`generate`, streamed: a `generating.Partial` for each step as it is written, then the result (`generate`'s,
        cached as it is). Closing the iterator stops the engine's work (nothing half-done is kept)."""
        ask = self._observe("generate", req, ask)
        return self.brancher.generate_stream(req, ask) if req.force else self.generator.generate_stream(req, ask)

    def check(self, req, max_prompts: int = MAX_COMPARE_PROMPTS, files: bool = False) -> cost.Cost:
        """Every check a request gets, without running it (the CLI asks before an engine starts): its planned
        cost, or RequestError. max_prompts, files: what the asker may ask (`lens`, `evaluate`)."""
        if isinstance(req, evaluating.EvaluateRequest):
            return evaluating.plan(self, req, files).cost
        if isinstance(req, InterveneRequest):
            return self.intervener.plan(req, self.intervention_inputs()).cost
        if isinstance(req, ComponentsRequest):
            return components.plan(self, req).cost
        if isinstance(req, LensRequest):
            return self.reader.plan(req, max_prompts).cost
        if isinstance(req, DescribeRequest):
            return self.describer.plan(req).cost
        if isinstance(req, (GenerateRequest, ChatRequest)):
            return (self.brancher if req.force else self.generator).plan(req).cost
        return cost.NOTHING          # another kind (a new one) is checked as it is planned, when it runs

    def describe(self, req: DescribeRequest, ask: Ask | None = None) -> Descriptions:
        """A cell (or a column of cells: one per layer) described in words by the model itself (Patchscopes)."""
        ask = self._observe("describe", req, ask)
        return self.describer.run(req, ask)

    def evaluate(self, req: evaluating.EvaluateRequest, files: bool = False,
                 ask: Ask | None = None) -> evaluating.EvaluationResult:
        """How well each loaded lens reads the unspoken intermediate of a set of items, layer by layer, at each
        prompt's last position (service/evaluating.py): a shipped set, computed once per model and lens and kept;
        with `files` (the command line), a file of the published form too."""
        ask = self._observe("evaluate", req, ask)
        return evaluating.run(self, req, files, ask)

    def chat(self, req: ChatRequest, ask: Ask | None = None) -> ChatReply:
        """Answer a conversation with a per-token readout of one lens at one layer (negative counts from the end);
        with `force`, the branch those tokens make of the reply (service/branching.py)."""
        ask = self._observe("chat", req, ask)
        return self.brancher.chat(req, ask) if req.force else self.generator.chat(req, ask)

    def chat_stream(self, req: ChatRequest, ask: Ask | None = None) -> Iterator:
        """`chat`, streamed as `generate_stream` is; with `force`, the branched reply comes whole, at the end."""
        ask = self._observe("chat", req, ask)
        return iter([self.brancher.chat(req, ask)]) if req.force else self.generator.chat_stream(req, ask)

    def intervene(self, req: InterveneRequest, progress=None, ask: Ask | None = None) -> InterventionResult:
        """Steer, ablate or patch, and read before and after (service/intervening/); identical requests are
        computed once (a generation here always has a seed: 0 unless given). `progress(step, p, norm)` hears
        a fitted vector's steps."""
        ask = self._observe("intervene", req, ask)
        inputs = self.intervention_inputs(ask)
        plan = self.intervener.plan(req, inputs)
        return self.cached("intervene", plan.decides(), lambda: self.intervener.carry_out(plan, inputs, progress),
                           pin=ask.pin)

    def intervention_inputs(self, ask: Ask = HOST) -> Inputs:
        """What `ask`'s intervention is planned against, as this service stands (its Jacobian lens may change)."""
        request, fits, info = self.cfg.limits, self.cfg.fits, self.info
        limits = Limits(request.part_cells, self.token_weight, request.max_work, request.request_timeout,
                        fits.max_fit_steps, fits.max_fit_seconds)
        jacobians = Jacobians(self.jlens, self.jlens_layers, info.n_layers, info.d_model)
        return Inputs(info, self.prompts, jacobians, limits, self.fits, ask)

    def components(self, req: ComponentsRequest, ask: Ask | None = None) -> ComponentsResult:
        """Who wrote the target's logit at a position: the embedding, each attention layer and head and each MLP,
        through the frozen final norm, and where the attention looked (service/components.py)."""
        ask = self._observe("components", req, ask)
        plan = components.plan(self, req)
        return self.cached("components", (plan.spec, req.prompt, req.target, req.foil),
                           lambda: components.run(self, plan, ask), pin=ask.pin)

    def check_cost(self, work: cost.Cost, what: str, advice: str = cost.ADVICE) -> None:
        """RequestError when `work` passes the budget (`max_work`), in one line saying what to reduce."""
        cost.check(work, self.token_weight, self.cfg.limits.max_work, what, advice)

    def admitted(self, work: cost.Cost, ask: Ask, made: Callable[[], cost.Cost] | None = None
                 ) -> contextlib.AbstractContextManager[Receipt]:
        """Engine work of this cost starts in this block: whoever asked for it pays (`Ask.paying`), where each
        request's work starts, after the cache (an answer it already holds costs nothing). Work the engine
        refuses (busy, over the asker's share, down, restarted) is given back whole; with `made` (what a
        generation's steps so far cost), the block ended or its stream closed early keeps only that."""
        weight = self.token_weight
        return ask.paying(work.units(weight), None if made is None else lambda: made().units(weight))

    def deadline(self, work: cost.Cost) -> float:
        """The seconds a request of this cost may take before the engine cancels it."""
        limits = self.cfg.limits
        return cost.deadline(work, self.token_weight, limits.max_work, limits.request_timeout)

    def cached(self, kind: str, parts: tuple, compute: Callable[[], T], pin: bool = False) -> T:
        """`compute()`, or what it gave for the same request before: kind and parts (what decides the answer) are
        the result cache's key, with the model and the Jacobian lens. `pin`: kept for good (an ask's `pin`, or a
        shipped evaluation's)."""
        return self.cache.get_or_compute(self._key(kind, *parts), compute, pin)

    def cached_stream(self, kind: str, parts: tuple, stream: Callable[[], Iterator]) -> Iterator:
        """`cached` for a streamed computation: what `stream()` yields as it comes, its last item kept (a result held,
        or being computed by an identical request: that alone). Closed before its end, it keeps nothing."""
        return self.cache.streamed(self._key(kind, *parts), stream)

    def holds(self, kind: str, parts: tuple, finished: bool = False) -> bool:
        """Whether the result cache has `cached(kind, parts, ...)`'s answer (or, unless `finished`, is computing
        it)."""
        return self.cache.holds(self._key(kind, *parts), finished)

    def cached_many(self, kind: str, parts: list[tuple], compute: Callable[[list[int]], list[T]],
                    pin: bool = False) -> list[T]:
        """`cached` for several requests of one kind at once: `compute(indices of those no cache holds)` gives
        their answers, in one call."""
        return self.cache.get_many([self._key(kind, *p) for p in parts], compute, pin)

    def chat_layers(self, name: str) -> list[int]:
        """The layers the chat readout can read through lens `name`: through J, those the J stack has."""
        chosen = lens(name)
        if not chosen.available(self.jlens is not None):
            raise RequestError(planning.NO_JLENS)
        return chosen.layers(self.info.n_layers, self.jlens_layers)

    # -- the rest ------------------------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> None:
        self.engine.wait_ready(timeout)

    def status(self) -> dict:
        """What a page's status line needs (state, reason, queue depth), read from the engine's counters: cheap
        enough for every open page every few seconds, unlike `health`, which looks at every process."""
        return self.engine.status()

    def idle(self) -> bool:
        """The engine is ready with nothing running or waiting (no process is looked at, unlike `health`)."""
        return self.engine.idle()

    def health(self) -> dict:
        info = self.info
        return {"model": info.name, "family": info.family, "backend": info.backend, "device": info.device,
                "dtype": info.dtype, "layers": info.n_layers, "max_model_len": info.max_model_len,
                "jacobian_lens": None if self.jlens is None else self.jlens.describe()["source"],
                **self.engine.health(), "cache": self.cache.stats(),
                "memory": {"plan": None if self.budget is None else self.budget.to_json(), "now": memory_in_use()}}

    def close(self) -> None:
        self.engine.close()
        self.fits.close()

    def _observe(self, kind: str, req, ask: Ask | None) -> Ask:
        """Tell the observer of a request that is counted; who asks (`ask`, or the handler's: `asks.asked`)."""
        ask = asked(ask)
        if self.observer is not None and ask.counted:
            try:
                self.observer(kind, req)
            except Exception:  # noqa: BLE001 - counting must never fail a request
                log.exception("the request observer failed")
        return ask

    def _key(self, kind: str, *parts) -> tuple:
        return (kind, self.info.name, self._jlens_key, parts)


async def warm_up(prompts: Prompts, info, backend: Backend) -> None:
    """Small lenses and generations on a fresh backend, so no visitor pays for compiling the fused
    readout. torch.compile specialises sizes 0 and 1, so every case is warmed: one layer or many, one
    position (a decode step) or many."""
    t = time.perf_counter()
    ids, n = prompts.ids("Hello, world"), info.n_layers
    for layers in (list(range(n)), [n - 1]):
        spec = planning.lens_spec(ids, layers, 1, (LOGIT.name,), n, [])
        await backend.run_lens(spec)
        await backend.run_generate(spec, Sampling(max_tokens=2))
    log.info("warm-up took %.1f s", time.perf_counter() - t)


def _reads_with_bos(jlens: jlens_files.JacobianLens | None) -> bool:
    """The one BOS rule (prompts.py): every prompt with BOS first when a lens reads through the Jacobian stack
    (lens_kinds: `reads_jlens`) and the loaded stack was fitted so."""
    return jlens is not None and reads_jlens(LENSES) and jlens_files.fitted_with_bos(jlens) is True
