"""The two ways to hold the model: nnsight's VLLM (GPU, or CPU via `vllm_cpu`) and TransformersModel.

Both run the same trace body, `lens_body`, which reads the residual of each needed layer,
hands it to `lenses.layer_readouts`, and returns small tensors. The backends differ only in
`read` (vLLM's blocks return `(hidden, residual)`, whose sum is the residual stream; HF's a
tensor) and `unembed` (vLLM's `logits_processor(lm_head, .)`, which applies any family
arithmetic; the HF head plus Gemma-style soft-capping).

On vLLM the body runs inside the engine's worker process: everything vocab-wide stays there.
The Jacobian matrices are installed in the worker once (`install_jlens`) and read from the
model object by each request, rather than shipped with every request.

This module deals in token ids; it knows nothing of text, results or the UI.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from .. import lenses
from .requests import LensSpec

log = logging.getLogger(__name__)

JLENS_ATTR = "lensapp_jlens"   # attribute on the worker's model holding {"layers": [...], "J": [n, d, d]}
CHAT_EDIT = "lensapp-chat"      # name of the chat readout installed with model.edit()


@dataclass(frozen=True)
class ModelInfo:
    name: str
    n_layers: int
    d_model: int
    vocab_size: int
    backend: str
    device: str
    dtype: str


# -- the shared trace body ------------------------------------------------------------------

def lens_body(model, spec: LensSpec, read, unembed, jlens: dict | None) -> dict:
    """Runs inside a trace (on vLLM: in the worker). Returns {lens: readout fields [L, P, ...]}.

    `read(layer_envoy) -> [P, d]`, `unembed(model, h) -> [rows, vocab]`. The last layer is always
    read: its lens is the model's own distribution, the reference for KL.
    """
    layers = model.model.layers
    h = torch.stack([read(layers[layer]).reshape(-1, read_dim(model)) for layer in spec.read_layers])
    norm = model.model.norm
    head = (lambda x: raw_unembed(model, x)) if spec.raw else (lambda x: unembed(model, x))
    final_logits = head(norm(h[-1])).float()
    final = lenses.FinalDistribution.from_logits(final_logits)
    rows = torch.tensor(spec.rows, device=h.device)
    hs = h.index_select(0, rows)
    target_ids = torch.tensor(spec.target_ids, dtype=torch.long, device=h.device) if spec.target_ids else None
    out = {}
    for name in spec.lenses:
        J = None
        if name == "jacobian":
            J = select_rows(jlens["J"], spec.jlens_rows)
        out[name] = lenses.layer_readouts(hs, norm, head, spec.k, final=final, J=J, target_ids=target_ids)
        if spec.full_probs:
            x = hs if J is None else torch.einsum("lpd,led->lpe", hs, J.to(hs.dtype))
            out[name]["full_probs"] = torch.softmax(head(norm(x.reshape(-1, x.shape[-1]))).float(), -1).reshape(
                hs.shape[0], hs.shape[1], -1)
    # The last layer's lens at the last position; backends overwrite it with the model's own logits.
    out["model_next_id"] = int(final_logits[-1].argmax())
    return out


def continuation_body(model, spec: LensSpec, read, unembed, jlens: dict | None, target: list[int], start: int) -> dict:
    """Runs on prompt + target[:-1]: log P(target | prompt) for each requested layer and lens -> {lens: [L]}."""
    layers = model.model.layers
    wanted = [spec.read_layers[r] for r in spec.rows]
    h = torch.stack([read(layers[layer]).reshape(-1, read_dim(model))[start:start + len(target)]
                     for layer in wanted])
    norm = model.model.norm
    head = (lambda x: raw_unembed(model, x)) if spec.raw else (lambda x: unembed(model, x))
    ids = torch.tensor(target, dtype=torch.long, device=h.device)
    out = {}
    for name in spec.lenses:
        J = None
        if name == "jacobian":
            J = select_rows(jlens["J"], spec.jlens_rows)
        out[name] = lenses.continuation_logprob(h, norm, head, ids, J=J)
    return out


def select_rows(stack: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """stack[rows], as a view when the rows are a contiguous run (the common case: no 20 MB copy)."""
    if rows == list(range(rows[0], rows[-1] + 1)):
        return stack[rows[0]:rows[-1] + 1]
    return stack.index_select(0, torch.tensor(rows, device=stack.device))


def read_dim(model) -> int:
    return model.model.norm.weight.shape[-1]


def raw_unembed(model, x):
    """norm(h) @ W_U.T with no family arithmetic (no soft-capping or logit scale); whole vocab.

    On vLLM the head weight is this rank's shard (and padded) under tensor parallelism, where
    `logits_processor` would have gathered: gather and trim the same way here.
    """
    logits = x @ model.lm_head.weight.T.to(x.dtype)
    if hasattr(model, "logits_processor"):
        from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_gather

        if get_tensor_model_parallel_world_size() > 1:  # pragma: no cover - needs several GPUs
            logits = tensor_model_parallel_all_gather(logits)
        logits = logits[..., :model.logits_processor.org_vocab_size]
    return logits


def vllm_read(layer):
    return sum(layer.output)


def vllm_unembed(model, x):
    return model.logits_processor(model.lm_head, x)


def hf_read(layer):
    out = layer.output
    return (out[0] if isinstance(out, tuple) else out)[0]     # batch of one


def hf_unembed(model, x):
    logits = model.lm_head(x)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


# -- backends ---------------------------------------------------------------------------------

class VLLMBackend:
    """nnsight's VLLM with dispatch=True. `cpu=True` swaps in the CPU worker adapter."""

    def __init__(self, path: str, name: str, *, cpu: bool, dtype: str, max_model_len: int,
                 gpu_memory_utilization: float, tensor_parallel_size: int):
        import nnsight  # noqa: F401  (after prepare_process_environment)

        if cpu:
            from .vllm_cpu import CPUVLLM as cls
        else:
            from nnsight.modeling.vllm import VLLM as cls
        self.model = cls(path, dispatch=True, dtype=dtype, max_model_len=max_model_len,
                         gpu_memory_utilization=gpu_memory_utilization or (0.3 if cpu else 0.85),
                         tensor_parallel_size=tensor_parallel_size, enable_prefix_caching=False)
        self.tokenizer = self.model.tokenizer
        llm = self.model.vllm_entrypoint
        # nnsight calls llm.generate for every trace, and vLLM then draws two progress bars: a server
        # answering many small requests would log little else.
        llm.generate = functools.partial(llm.generate, use_tqdm=False)
        cfg = llm.llm_engine.model_config.hf_config
        self.info = ModelInfo(name=name, n_layers=cfg.num_hidden_layers, d_model=cfg.hidden_size,
                              vocab_size=cfg.vocab_size, backend="vllm-cpu" if cpu else "vllm",
                              device="cpu" if cpu else "cuda", dtype=dtype)
        self.jlens_layers: list[int] = []
        self._chat_edit = None            # the installed chat readout (an nnsight Registration)
        self._chat_key: tuple | None = None

    def install_jlens(self, layers: list[int], J: torch.Tensor) -> None:
        """Ship the J stack [n, d, d] to the worker once; later requests index into it there."""
        import nnsight

        model = self.model
        payload = {"layers": list(layers), "J": J}
        with model.trace([self.tokenizer.eos_token_id or 0], temperature=0.0, max_tokens=1):
            target = model.model._module
            device = next(target.parameters()).device
            setattr(target, JLENS_ATTR, {"layers": payload["layers"], "J": payload["J"].to(device)})
            done = nnsight.save(True)
        if not done:
            raise RuntimeError("installing the Jacobian lens in the worker failed")
        self.jlens_layers = list(layers)

    def run_lens(self, specs: list[LensSpec], continuations: list[tuple[int, list[int], int]] = ()) -> tuple[list, list]:
        """One forward for all prompts (one invoke each), plus one invoke per multi-token target.

        continuations: (spec index, prompt+target[:-1] ids, start position, target ids) tuples.
        """
        import nnsight

        model = self.model
        with model.trace(temperature=0.0, max_tokens=1) as tracer:
            outs = nnsight.save([None] * len(specs))
            conts = nnsight.save([None] * len(continuations))
            for i, spec in enumerate(specs):
                with tracer.invoke(list(spec.input_ids)):
                    jl = getattr(model.model._module, JLENS_ATTR, None) if "jacobian" in spec.lenses else None
                    res = lens_body(model, spec, vllm_read, vllm_unembed, jl)
                    res["model_next_id"] = int(model.logits[-1].argmax())
                    outs[i] = res
            for j, (i, ids, start, target) in enumerate(continuations):
                with tracer.invoke(list(ids)):
                    jl = getattr(model.model._module, JLENS_ATTR, None) if "jacobian" in specs[i].lenses else None
                    conts[j] = continuation_body(model, specs[i], vllm_read, vllm_unembed, jl, target, start)
        # A saved list no invoke wrote to is not sent back: no continuations, no `conts`.
        return list(outs), (list(conts) if continuations else [])

    def run_generate(self, spec: LensSpec, max_tokens: int, temperature: float, seed: int | None) -> tuple[list, list]:
        """Greedy or sampled generation with a readout at every step -> (step readouts, token ids)."""
        import nnsight

        model = self.model
        kwargs = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        if seed is not None:
            kwargs["seed"] = int(seed)
        with model.trace(list(spec.input_ids), **kwargs) as tracer:
            steps = nnsight.save([])
            jl = getattr(model.model._module, JLENS_ATTR, None) if "jacobian" in spec.lenses else None
            for _ in tracer.iter[:max_tokens]:
                steps.append(lens_body(model, spec, vllm_read, vllm_unembed, jl))
            result = nnsight.save(tracer.result)
        return list(steps), list(result.outputs[0].token_ids)

    def run_chat(self, spec: LensSpec, max_tokens: int, temperature: float, seed: int | None) -> tuple[list, list]:
        """Generate with the chat readout (one layer, one lens, top-k per token) -> (token ids, [(ids, probs)]).

        The readout is installed once with `model.edit()` and rides every later chat request
        (reinstalled only when the layer, lens or k changes), so a turn pays only its own
        readout. Requests that do not name the edit (lens traces) also run it, one row per
        step: negligible next to their own readout.
        """
        key = (spec.read_layers[spec.rows[0]], spec.jlens_rows[0] if spec.jlens_rows else None, spec.k,
               tuple(self.jlens_layers))
        if key != self._chat_key:
            self._install_chat_readout(*key[:3])
            self._chat_key = key
        kwargs = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        if seed is not None:
            kwargs["seed"] = int(seed)
        out = self.model.generate([{"prompt_token_ids": list(spec.input_ids)}], edits=[CHAT_EDIT], **kwargs)[0]
        steps = out.saves.get("readout") or []
        return list(out.outputs[0].token_ids), [(list(ids), list(p)) for ids, p in steps]

    def _install_chat_readout(self, layer: int, jrow: int | None, k: int) -> None:
        import nnsight

        if self._chat_edit is not None:
            self._chat_edit.clear()
            self._chat_edit = None
        model = self.model
        with model.edit(name=CHAT_EDIT) as (tracer, edit):
            readout = nnsight.save([])
            for _ in tracer.all():
                h = vllm_read(model.model.layers[layer])[-1:]                     # [1, d_model], newest position
                if jrow is not None:
                    h = lenses.transport(h, getattr(model.model._module, JLENS_ATTR)["J"][jrow])
                top = lenses.readout(vllm_unembed(model, model.model.norm(h)).float(), k)
                readout.append((top["top_ids"][0].tolist(), top["top_probs"][0].tolist()))
        self._chat_edit = edit

    def close(self) -> None:
        """Shut vLLM's EngineCore and worker processes down (they outlive a SIGTERM otherwise)."""
        llm = getattr(self.model, "vllm_entrypoint", None)
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as e:  # already gone
            log.debug("engine shutdown: %s", e)
        self.model.vllm_entrypoint = None


def load_transformers_model(path: str, *, device: str, dtype: torch.dtype):
    """nnsight's TransformersModel, loaded now, in eval mode (the engine's fallback and the lens fitter)."""
    from nnsight import TransformersModel

    model = TransformersModel(path, task="text-generation", device_map=device, dtype=dtype, dispatch=True)
    model._module.eval()
    return model


class TransformersBackend:
    """nnsight's TransformersModel over HF transformers: no vLLM needed, and it has a backward pass."""

    def __init__(self, path: str, name: str, *, device: str, dtype: str):
        self.model = load_transformers_model(path, device=device, dtype=getattr(torch, dtype))
        self.tokenizer = self.model.tokenizer
        cfg = self.model.config
        self.info = ModelInfo(name=name, n_layers=cfg.num_hidden_layers, d_model=cfg.hidden_size,
                              vocab_size=cfg.vocab_size, backend="transformers", device=device, dtype=dtype)
        self.jlens: dict | None = None
        self.jlens_layers: list[int] = []

    def install_jlens(self, layers: list[int], J: torch.Tensor) -> None:
        device = next(self.model._module.parameters()).device
        self.jlens = {"layers": list(layers), "J": J.to(device)}
        self.jlens_layers = list(layers)

    def run_lens(self, specs: list[LensSpec], continuations=()) -> tuple[list, list]:
        import nnsight

        model, outs, conts = self.model, [], []
        # One trace per prompt: HF would pad a multi-prompt batch, and positions would shift.
        with torch.no_grad():
            for spec in specs:
                with model.trace(torch.tensor([spec.input_ids])):
                    res = lens_body(model, spec, hf_read, hf_unembed, self.jlens)
                    res["model_next_id"] = int(model.lm_head.output[0, -1].argmax())
                    res = nnsight.save(res)
                outs.append(res)
            for i, ids, start, target in continuations:
                with model.trace(torch.tensor([ids])):
                    res = nnsight.save(continuation_body(model, specs[i], hf_read, hf_unembed, self.jlens, target, start))
                conts.append(res)
        return outs, conts

    def run_generate(self, spec: LensSpec, max_tokens: int, temperature: float, seed: int | None):
        import nnsight

        model = self.model
        if seed is not None:
            torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": float(temperature)} if temperature > 0 else {"do_sample": False}
        with torch.no_grad(), model.generate(torch.tensor([spec.input_ids]), max_new_tokens=max_tokens,
                                             pad_token_id=self.tokenizer.eos_token_id, **sampling) as tracer:
            steps = nnsight.save([])
            for _ in tracer.iter[:max_tokens]:
                steps.append(lens_body(model, spec, hf_read, hf_unembed, self.jlens))
            out = nnsight.save(tracer.result)
        ids = out[0].tolist()[len(spec.input_ids):]
        return steps[:len(ids)], ids

    def run_chat(self, spec: LensSpec, max_tokens: int, temperature: float, seed: int | None) -> tuple[list, list]:
        """The chat readout as a plain traced generation (no edits here): -> (token ids, [(ids, probs)])."""
        steps, ids = self.run_generate(spec, max_tokens, temperature, seed)
        name = spec.lenses[0]
        return ids, [(s[name]["top_ids"][0, -1].tolist(), s[name]["top_probs"][0, -1].tolist()) for s in steps]

    def close(self) -> None:
        pass
