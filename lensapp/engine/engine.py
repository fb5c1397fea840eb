"""The one owner of the model.

nnsight's client is not thread-safe, and a served app has many threads (Gradio's workers, a
workshop of thirty browsers). So exactly one thread, owned by `Engine`, ever runs a trace;
every caller submits a job and waits on its future. Lens jobs that are waiting together are
run as one forward (one invoke per prompt), which is where a GPU's throughput comes from.

The engine validates and tokenises on the caller's thread, runs traces on its own, and turns
the small tensors that come back into `results` objects. It knows nothing of Gradio or charts.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from .. import jlens as jlens_files
from ..config import EMBEDDED, MAX_CONTINUATION_TOKENS, MAX_PROMPT_CHARS, Config
from ..results import ChatReply, GenerationResult, GenerationStep, LensReadout, LensResult
from .backends import ModelInfo, TransformersBackend, VLLMBackend
from .requests import (LENS_CHOICES, GenerateRequest, LensRequest, LensSpec, RequestError, parse_layers,
                       plan_batches, validate_common, validate_generate)
from .tokens import TokenDecoder

log = logging.getLogger(__name__)

# A lens request may ask for full-vocab probabilities only while L x P x vocab stays below this.
MAX_FULL_PROB_VALUES = 20_000_000
# Tokens per forward when batching waiting prompts together.
MAX_BATCH_TOKENS = 8192


@dataclass
class _Job:
    future: Future
    specs: list[LensSpec] | None = None           # a lens job (batchable)
    continuations: list | None = None
    call: object = None                           # any other job: fn(backend) -> value


CHAT_ROLES = ("system", "user", "assistant")


class Engine:
    def __init__(self, backend, cfg: Config):
        self.backend = backend
        self.cfg = cfg
        self.info: ModelInfo = backend.info
        self.tokenizer = backend.tokenizer
        self.decode = TokenDecoder(self.tokenizer)
        self.jlens: jlens_files.JacobianLens | None = None
        self.jlens_error: str | None = None
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="lens-engine", daemon=True)
        self._thread.start()

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: Config) -> "Engine":
        """Resolve the model, start the backend, preload the configured Jacobian lens."""
        path, name = resolve_model(cfg)
        device, dtype = cfg.resolved_device, cfg.resolved_dtype
        if cfg.backend == "vllm":
            backend = VLLMBackend(path, name, cpu=device == "cpu", dtype=dtype, max_model_len=cfg.max_model_len,
                                  gpu_memory_utilization=cfg.gpu_memory_utilization,
                                  tensor_parallel_size=cfg.tensor_parallel_size)
        else:
            backend = TransformersBackend(path, name, device=device, dtype=dtype)
        engine = cls(backend, cfg)
        try:
            spec = cfg.resolved_jlens
            if spec:
                try:
                    engine.load_jlens(spec, cfg.jlens_layer_list)
                except jlens_files.LensFileError as e:
                    if cfg.jlens != "default":   # asked for by name: a lens that does not load is an error
                        raise
                    # The model's default lens (e.g. a hub download while offline): serve the logit lens, say why.
                    engine.jlens_error = str(e)
                    log.warning("serving without a Jacobian lens: %s", e)
            engine.warm_up()
        except BaseException:
            engine.close()                       # never leave vLLM's processes behind (a bad lens, Ctrl-C)
            raise
        return engine

    def warm_up(self) -> None:
        """Run small lenses and generations, so no visitor pays for compiling the fused readout."""
        t = time.perf_counter()
        try:
            # torch.compile specialises sizes 0 and 1, so warm every case: one layer or many, one position
            # (a decode step) or many; otherwise the first such request pays a recompile mid-serve.
            for layers in ("all", "last"):
                self.lens(LensRequest(prompts=("Hello, world",), layers=layers, k=1))
                self.generate(GenerateRequest(prompt="Hello", max_tokens=2, layers=layers, k=1))
        except Exception:  # noqa: BLE001 - a failed warm-up only costs the first request time
            log.exception("warm-up failed")
        log.info("warm-up took %.1f s", time.perf_counter() - t)

    def load_jlens(self, spec: str, layers: list[int] | None = None) -> jlens_files.JacobianLens:
        """Load, validate and install a lens (replacing any other). LensFileError names the mismatch."""
        unembedding = jlens_files.model_unembedding_fingerprint(resolve_model(self.cfg)[0])
        lens = jlens_files.load(spec, d_model=self.info.d_model, n_layers=self.info.n_layers, layers=layers,
                                dtype=torch.bfloat16, cache_dir=self.cfg.resolved_cache_dir / "hub",
                                model_name=self.info.name, unembedding=unembedding)
        for warning in lens.warnings:
            log.warning("lens %s: %s", spec, warning)
        return self.install_jlens(lens)

    def install_jlens(self, lens: jlens_files.JacobianLens) -> jlens_files.JacobianLens:
        last = self.info.n_layers - 1
        layers = lens.layers + [last]      # the target layer reads with J = I, as published lenses do
        stack = torch.stack([lens.J[layer] for layer in lens.layers] +
                            [torch.eye(self.info.d_model, dtype=torch.bfloat16)])
        self._submit(_Job(Future(), call=lambda backend: backend.install_jlens(layers, stack))).result()
        self.jlens = lens
        return lens

    @property
    def jlens_layers(self) -> list[int]:
        return [] if self.jlens is None else self.jlens.layers + [self.info.n_layers - 1]

    # -- public API (thread-safe) ---------------------------------------------------------------
    def tokenize(self, prompt: str, chat: bool = False) -> list[int]:
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise RequestError("this model's tokenizer has no chat template; turn chat off")
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = list(ids)
        if not ids:
            raise RequestError("the prompt has no tokens")
        if len(ids) > self.cfg.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(ids)} tokens; the limit is {self.cfg.max_prompt_tokens}")
        return ids

    def target_ids(self, target: str) -> list[int]:
        """A target is scored as it would follow the prompt: a leading space is added unless it has one."""
        text = target if target[:1].isspace() else " " + target
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise RequestError(f"target {target!r} has no tokens")
        return list(ids)

    def lens(self, req: LensRequest) -> list[LensResult]:
        """Every requested lens, layer and position for each prompt, in one forward."""
        validate_common(req.prompts, req.lens, req.k, req.targets)
        names = LENS_CHOICES[req.lens]
        layers = self._layers_for(req.layers, names)
        targets = [(t.strip(), self.target_ids(t.strip())) for t in req.targets]
        specs, conts, prompt_ids = [], [], []
        for i, prompt in enumerate(req.prompts):
            ids = self.tokenize(prompt, req.chat)
            if req.full_probs and len(layers) * len(ids) * self.info.vocab_size > MAX_FULL_PROB_VALUES:
                raise RequestError("full probabilities are only for small runs: select fewer layers or a shorter prompt")
            specs.append(self._spec(ids, layers, req.k, names, [t[1][0] for t in targets], req.raw, req.full_probs))
            prompt_ids.append(ids)
            for j, (_, tids) in enumerate(targets):
                # A whole continuation costs a [layers x its tokens, vocab] readout: long ones get first-token scores.
                if 1 < len(tids) <= MAX_CONTINUATION_TOKENS:
                    conts.append((i, ids + tids[:-1], len(ids) - 1, tids, j))
        job = _Job(Future(), specs=specs, continuations=conts)
        outs, cont_outs = self._submit(job).result()
        results = []
        for i, (prompt, ids, out) in enumerate(zip(req.prompts, prompt_ids, outs)):
            lens_out = {}
            for name in names:
                raw = dict(out[name])
                per_target = [None] * len(targets)
                for (pi, _, _, _, j), c in zip(conts, cont_outs):
                    if pi == i:
                        per_target[j] = c[name]
                raw["continuation_logprob"] = per_target
                lens_out[name] = LensReadout.from_readout(raw, self.decode, targets)
            full = None
            if req.full_probs:
                full = {n: out[n]["full_probs"].cpu().numpy() for n in names}[names[0]]
            next_id = int(out["model_next_id"])
            results.append(LensResult(
                prompt=prompt, input_ids=ids, input_tokens=self.decode(ids), layers=layers, lenses=lens_out,
                model_next_id=next_id, model_next_token=self.decode([next_id])[0], model=self.info.name,
                jlens=self.jlens.describe() if self.jlens and "jacobian" in names else None, full_probs=full))
        return results

    def generate(self, req: GenerateRequest) -> GenerationResult:
        """Generate and read the newest position at every step (step 0: all prompt positions)."""
        validate_generate(req)
        names = LENS_CHOICES[req.lens]
        layers = self._layers_for(req.layers, names)
        ids = self.tokenize(req.prompt, req.chat)
        spec = self._spec(ids, layers, req.k, names, [], req.raw, False)
        job = _Job(Future(), call=lambda b: b.run_generate(spec, req.max_tokens, req.temperature, req.seed))
        steps_raw, gen_ids = self._submit(job).result()
        steps = []
        for s, (raw, tok) in enumerate(zip(steps_raw, gen_ids)):
            pos_ids = ids if s == 0 else [gen_ids[s - 1]]
            lens_out = {n: LensReadout.from_readout(dict(raw[n]), self.decode) for n in names}
            readout = LensResult(prompt=req.prompt, input_ids=list(pos_ids), input_tokens=self.decode(pos_ids),
                                 layers=layers, lenses=lens_out, model_next_id=int(tok),
                                 model_next_token=self.decode([tok])[0], model=self.info.name)
            steps.append(GenerationStep(token_id=int(tok), token=self.decode([tok])[0], readout=readout))
        text = self.tokenizer.decode(gen_ids, skip_special_tokens=True)
        return GenerationResult(prompt=req.prompt, text=text, token_ids=[int(t) for t in gen_ids],
                                tokens=self.decode(gen_ids), steps=steps, model=self.info.name)

    def chat(self, messages: list[dict], layer: int | None = None, lens: str = "jacobian", max_tokens: int = 32,
             temperature: float = 0.0, k: int = 3, seed: int | None = None) -> ChatReply:
        """Answer a conversation (the tokenizer's chat template) with a per-token readout at one layer.

        messages: [{"role": "user" | "assistant" | "system", "content": str}, ...], ending with the user.
        layer None: the lens's layer nearest two thirds of the depth. The readout is installed in
        the engine once (vLLM: `model.edit()`), so each turn pays only its own readout.
        """
        if lens not in ("logit", "jacobian"):
            raise RequestError(f"the chat readout is one lens, logit or jacobian; got {lens!r}")
        msgs = _check_messages(messages)
        validate_generate(GenerateRequest(prompt=msgs[-1]["content"], max_tokens=max_tokens, lens=lens, k=k,
                                          temperature=temperature))
        names = LENS_CHOICES[lens]
        if layer is None:
            pool = self._layers_for("all", names)
            layer = min(pool, key=lambda x: abs(x - 2 * (self.info.n_layers - 1) / 3))
        layers = self._layers_for(str(layer), names)
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestError("this model's tokenizer has no chat template")
        # The oldest turns go first: by characters (cheap), then by the templated prompt's tokens.
        dropped = 0
        while sum(len(m["content"]) for m in msgs) > MAX_PROMPT_CHARS and (n := _drop_oldest_turn(msgs)):
            dropped += n
        while True:
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            if len(ids) <= self.cfg.max_prompt_tokens:
                break
            n = _drop_oldest_turn(msgs)
            if not n:
                raise RequestError(f"the message has {len(ids)} tokens; the limit is {self.cfg.max_prompt_tokens}")
            dropped += n
        spec = self._spec(ids, layers, k, names, [], False, False)
        gen_ids, steps = self.call(lambda b: b.run_chat(spec, max_tokens, temperature, seed))
        readout = [list(zip(self.decode(top), [float(p) for p in probs])) for top, probs in steps]
        return ChatReply(text=self.tokenizer.decode(gen_ids, skip_special_tokens=True),
                         token_ids=[int(t) for t in gen_ids], tokens=self.decode(gen_ids), lens=lens, layer=layers[0],
                         readout=readout[:len(gen_ids)], dropped_turns=dropped)

    def call(self, fn):
        """Run fn(backend) on the owner thread (for code that needs the model itself, e.g. chat edits)."""
        return self._submit(_Job(Future(), call=fn)).result()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=60)
        self.backend.close()

    # -- internals --------------------------------------------------------------------------------
    def _layers_for(self, text: str, names: tuple[str, ...]) -> list[int]:
        if "jacobian" in names:
            if self.jlens is None:
                raise RequestError("no Jacobian lens is loaded (start with --jlens PATH or HUB_REPO:FILE)")
            return parse_layers(text, self.info.n_layers, allowed=self.jlens_layers)
        return parse_layers(text, self.info.n_layers)

    def _spec(self, ids, layers, k, names, target_ids, raw, full_probs) -> LensSpec:
        last = self.info.n_layers - 1
        read = sorted(set(layers) | {last})
        jrows = None
        if "jacobian" in names:
            jrows = [self.jlens_layers.index(layer) for layer in layers]
        return LensSpec(input_ids=ids, read_layers=read, rows=[read.index(layer) for layer in layers], k=k,
                        lenses=names, jlens_rows=jrows, target_ids=target_ids, raw=raw, full_probs=full_probs)

    def _submit(self, job: _Job) -> Future:
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        self._queue.put(job)
        return job.future

    def _serve(self) -> None:
        held: deque[_Job | None] = deque()     # a job met while draining lens jobs: it runs next, in order
        while True:
            job = held.popleft() if held else self._queue.get()
            if job is None:
                return
            if job.call is not None:
                self._run(job.future, lambda: job.call(self.backend))
                continue
            jobs = [job]                                      # drain the lens jobs waiting right behind it
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.call is not None:
                    held.append(nxt)                          # a generation or chat is not overtaken
                    break
                jobs.append(nxt)
            self._run_lens_jobs(jobs)

    def _run_lens_jobs(self, jobs: list[_Job]) -> None:
        sizes = [sum(len(s.input_ids) for s in j.specs) for j in jobs]
        for batch in plan_batches(sizes, self.cfg.max_batch, MAX_BATCH_TOKENS):
            group = [jobs[i] for i in batch]
            specs = [s for j in group for s in j.specs]
            conts, offset = [], 0
            for j in group:
                conts += [(i + offset, ids, start, target) for i, ids, start, target, _ in j.continuations]
                offset += len(j.specs)
            try:
                outs, cont_outs = self.backend.run_lens(specs, conts)
            except BaseException as e:  # noqa: BLE001 - every waiting caller must hear of it
                if len(group) > 1:   # one request's failure must not cost the others theirs
                    log.warning("a batch of %d lens requests failed (%s); running them one by one", len(group), e)
                    for j in group:
                        self._run_lens_jobs([j])
                    continue
                log.exception("lens request failed")
                group[0].future.set_exception(e)
                continue
            s_off = c_off = 0
            for j in group:
                n, m = len(j.specs), len(j.continuations)
                j.future.set_result((outs[s_off:s_off + n], cont_outs[c_off:c_off + m]))
                s_off, c_off = s_off + n, c_off + m

    @staticmethod
    def _run(future: Future, fn) -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001
            future.set_exception(e)


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestError("the conversation is empty")
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise RequestError("each message must be {'role': 'system' | 'user' | 'assistant', 'content': str}")
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "user":
        raise RequestError("the conversation must end with a user message")
    return out


def _drop_oldest_turn(msgs: list[dict]) -> int:
    """Drop the oldest user message (and the reply to it) in place; 0 when only the last one is left."""
    if sum(m["role"] != "system" for m in msgs) <= 1:
        return 0
    first = next(i for i, m in enumerate(msgs) if m["role"] != "system")
    n = 2 if first + 1 < len(msgs) - 1 and msgs[first + 1]["role"] == "assistant" else 1
    del msgs[first:first + n]
    return n


def resolve_model(cfg: Config) -> tuple[str, str]:
    """(path or hub id vLLM/transformers can load, display name)."""
    if cfg.model == EMBEDDED:
        from .embedded import EMBEDDED_NAME, embedded_model_dir

        return str(embedded_model_dir(cfg.resolved_cache_dir / "models")), EMBEDDED_NAME
    return cfg.model, cfg.model
