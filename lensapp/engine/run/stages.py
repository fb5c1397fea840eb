"""Pipeline stages: every layer's residual read where the final norm, the unembedding and the J stack live.

Under pipeline parallelism each vLLM worker holds a run of blocks, and only the last stage holds the final
norm and the unembedding (the others have vLLM's `PPMissingLayer` there). A lens reads layer `l` through
both, so a readout cannot run where layer `l` lives unless every stage holds a copy of the head. Instead
the residuals travel to the last stage:

- an earlier stage records each of its blocks' outputs (a plain forward hook, installed once) and, after
  its forward, stacks the residual streams [layers, tokens, d_model] into the `IntermediateTensors` vLLM
  sends on to the next stage anyway, under `RESIDUALS` (a middle stage adds its own to those it received);
- the last stage takes them out before vLLM copies the tensors it knows into its buffers, and, before its
  own forward, calls each earlier layer's `PPMissingLayer` (an identity) with that layer's residual, so
  nnsight's hook on it fires and a trace reads `blocks[l].output` there as it would on one worker;
- trace bodies on an earlier stage read only their own layers (making their edits) and return before the
  readout (`is_last_stage`); the last stage's saved values are the request's (nnsight reports a trace's
  saves from the first stage: `vllm_cpu` has the last report them instead);
- a request's pickle names modules of the whole model, some of which are on another stage: `StandIns`
  resolves those to a placeholder that never runs here.

What moves per step: tokens x d_model values per layer before the last stage (fp32 on CPU, the model's
dtype on GPU), besides vLLM's own hidden state. docs/parallel.md sizes it for large models.

`StageRunner` is the runner's side, mixed into nnsight's model runner by both workers (`vllm_cpu`,
`vllm_gpu`). This module knows vLLM's worker side and nothing of text or lenses; it imports vLLM and
nnsight only inside the worker. The vLLM backend hands trace bodies `is_last_stage`, `runs_here` and
`gather_head_shards` (raw logits under tensor parallelism) through their `site.Site`: traces import no
backend.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types

import torch

RESIDUALS = "lensapp_residuals"       # key in vLLM's IntermediateTensors: [earlier layers, tokens, d_model]
PAIRED = "residual"                   # vLLM's own key when blocks return (hidden, residual) to be summed


def is_last_stage() -> bool:
    """True on the pipeline's last stage, on one worker, and outside vLLM (the transformers backend)."""
    state = sys.modules.get("vllm.distributed.parallel_state")
    if state is None or not state.model_parallel_is_initialized():
        return True
    return state.get_pp_group().is_last_rank


def gather_head_shards(model, logits: torch.Tensor) -> torch.Tensor:
    """Raw logits from this rank's rows of the unembedding -> the whole vocab, as `logits_processor` gathers
    its own (tensor parallelism splits the head by vocab rows, padded)."""
    from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_gather

    return gather_vocab(logits, model.logits_processor.org_vocab_size, get_tensor_model_parallel_world_size(),
                        tensor_model_parallel_all_gather)


def unembedding_rows(head, ids: torch.Tensor) -> torch.Tensor:
    """The unembedding's rows for `ids` [n, d_model], whole on every rank: under tensor parallelism each rank
    holds a run of the vocabulary (vLLM's `shard_indices`); its own rows, zeros elsewhere, summed over ranks."""
    from vllm.distributed import get_tp_group

    if getattr(head, "bias", None) is not None:
        raise ValueError("an unembedding with a bias is not one the components readout knows")
    group = get_tp_group()
    if group.world_size == 1:
        return head.weight[ids]
    shard = head.shard_indices
    inside = (ids >= shard.org_vocab_start_index) & (ids < shard.org_vocab_end_index)
    local = (ids - shard.org_vocab_start_index).clamp(0, head.weight.shape[0] - 1)
    rows = torch.where(inside[:, None], head.weight[local], torch.zeros((), dtype=head.weight.dtype,
                                                                        device=head.weight.device))
    return _summed(rows.contiguous(), group)


def project_local(module, x: torch.Tensor) -> torch.Tensor:
    """A vLLM linear layer applied to x without its bias and without summing over ranks: this rank's slice
    of the weight alone (vLLM's CPU layers keep their weight only in a packed form the layer applies). x must
    be as wide as the layer's own input on this rank: its native kernels do not check, and a wider x
    corrupts the worker's memory (seen under TP=2, where nnsight hands a row-parallel layer's input whole)."""
    width = getattr(module, "input_size_per_partition", None)
    if width is not None and x.shape[-1] != width:
        raise ValueError(f"{type(module).__name__} takes {width} inputs on this rank; got {tuple(x.shape)}")
    method = getattr(module, "quant_method", None)
    if method is None:
        return torch.nn.functional.linear(x, module.weight)
    return method.apply(module, x, None)


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 on one worker)."""
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def gather_heads(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x with this rank's attention heads along `dim` -> every rank's, in head order (tensor parallelism
    splits the heads in contiguous runs by rank)."""
    from vllm.distributed import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(group.world_size)]
    torch.distributed.all_gather(parts, x.contiguous(), group=group.device_group)
    return torch.cat(parts, dim=dim)


def _summed(x: torch.Tensor, group) -> torch.Tensor:
    """x summed over the tensor-parallel ranks, through torch.distributed's own collective on the group's device
    group (a few small tensors, once per request)."""
    torch.distributed.all_reduce(x, group=group.device_group)
    return x


def gather_vocab(logits: torch.Tensor, vocab: int, world_size: int, all_gather) -> torch.Tensor:
    """Each tensor-parallel rank's vocab shard -> the whole vocab, padding trimmed (vLLM's layout)."""
    if world_size > 1:
        logits = all_gather(logits)
    return logits[..., :vocab]


def runs_here(block) -> bool:
    """Whether a block (module or nnsight envoy) runs on this stage: not vLLM's placeholder for another's."""
    module = getattr(block, "_module", block)
    return type(module).__name__ != "PPMissingLayer"


def stream(output) -> torch.Tensor:
    """A block's output -> the residual stream after it ((hidden, residual) pairs summed), [tokens, d_model]."""
    if isinstance(output, tuple):
        hidden, res = output[0], output[1] if len(output) > 1 else None
        return hidden if not isinstance(res, torch.Tensor) else hidden + res
    return output


def stage_blocks(model: torch.nn.Module) -> tuple[torch.nn.ModuleList, int, int]:
    """The decoder's blocks and this stage's run of them [start, end) (vLLM's start_layer / end_layer)."""
    for module in model.modules():
        start, end = getattr(module, "start_layer", None), getattr(module, "end_layer", None)
        if start is None or end is None:
            continue
        for child in module.children():
            if isinstance(child, torch.nn.ModuleList) and len(child) >= end:
                return child, start, end
    raise RuntimeError(f"{type(model).__name__}: no decoder blocks with start_layer / end_layer found")


class StandIns(dict):
    """nnsight's map of persistent ids (`Module:<path>`) to this worker's objects, where a module of another
    stage (`model.model.layers.2.self_attn`, `model.logits_processor`: the client's whole-model tree names
    them, and a request's pickle carries them) resolves to a placeholder that never runs here, so is never
    read, instead of failing the request with UnknownPersistentIdError."""

    def __init__(self, objects: dict):
        super().__init__(objects)
        from vllm.model_executor.models.utils import PPMissingLayer

        self.placeholder = PPMissingLayer()

    def __contains__(self, pid) -> bool:
        return dict.__contains__(self, pid) or (isinstance(pid, str) and pid.startswith("Module:"))

    def __missing__(self, pid):
        if isinstance(pid, str) and pid.startswith("Module:"):
            return self.placeholder
        raise KeyError(pid)


class StageRelay:
    """One worker's side of the relay: records its blocks' outputs, ships and receives residuals."""

    def __init__(self, model: torch.nn.Module, first: bool, last: bool):
        self.first, self.last = first, last
        self.blocks, self.start, self.end = stage_blocks(model)
        self.outputs: dict[int, object] = {}
        self.received: torch.Tensor | None = None
        if not last:
            for layer in range(self.start, self.end):
                self.blocks[layer].register_forward_hook(self._record(layer))

    def _record(self, layer: int):
        def hook(module, args, output):
            # A reference: nnsight's edits change the output in place after this hook, and the stack
            # is built after the forward, so it carries the edited stream.
            self.outputs[layer] = output
        return hook

    def take(self, tensors: dict) -> dict:
        """vLLM's received tensors without RESIDUALS, which this relay keeps for the forward."""
        self.received = tensors.get(RESIDUALS)
        return {k: v for k, v in tensors.items() if k != RESIDUALS}

    def before_forward(self, num_tokens: int, paired: bool) -> None:
        """On the last stage: fire each earlier layer's placeholder with its residual, in layer order."""
        if not self.last or self.received is None:
            return
        for layer in range(self.start):
            h = self.received[layer, :num_tokens]
            self.blocks[layer]((h, None) if paired else h)

    def after_forward(self, output):
        """On an earlier stage: the IntermediateTensors to send on, with every residual so far added."""
        if self.last or not hasattr(output, "tensors"):
            return output
        own = [stream(self.outputs[layer]) for layer in range(self.start, self.end)]
        tokens = own[0].shape[0]
        if self.received is not None:
            own = list(self.received[:, :tokens].unbind(0)) + own
        output.tensors[RESIDUALS] = torch.stack(own).contiguous()
        self.outputs.clear()
        return output


class StageRunner:
    """Mixed into an nnsight model runner ahead of it: under pipeline parallelism, the relay, the stand-ins,
    and the last stage reporting the saves. Inert on one stage."""

    _lensapp_relay: StageRelay | None = None

    def load_model(self, *args, **kwargs):
        from vllm.distributed import get_pp_group

        super().load_model(*args, **kwargs)
        pp = get_pp_group()
        if pp.world_size > 1:
            self._lensapp_relay = StageRelay(self.get_model(), pp.is_first_rank, pp.is_last_rank)
            self.nnsight_persistent_objects = StandIns(self.nnsight_persistent_objects)

    def sync_and_gather_intermediate_tensors(self, num_tokens, intermediate_tensors, sync_self):
        from vllm.sequence import IntermediateTensors

        if intermediate_tensors is not None and self._lensapp_relay is not None:
            intermediate_tensors = IntermediateTensors(self._lensapp_relay.take(intermediate_tensors.tensors))
        return super().sync_and_gather_intermediate_tensors(num_tokens, intermediate_tensors, sync_self)

    def _model_forward(self, input_ids=None, positions=None, intermediate_tensors=None, inputs_embeds=None,
                       **model_kwargs):
        relay = self._lensapp_relay
        if relay is not None:
            paired = intermediate_tensors is not None and PAIRED in intermediate_tensors.tensors
            relay.before_forward(positions.shape[-1], paired)
        output = super()._model_forward(input_ids=input_ids, positions=positions,
                                        intermediate_tensors=intermediate_tensors, inputs_embeds=inputs_embeds,
                                        **model_kwargs)
        return output if relay is None else relay.after_forward(output)

    def _reports_saves(self) -> bool:
        """Whether this rank reports a trace's saves: every readout runs on the last stage, so that stage does
        (nnsight's own rule is the pipeline's first rank). nnsight calls this where it has the hook
        (docs/upstream/nnsight-reports-saves.patch); nnsight 0.8.1 does not, so `collect_nnsight` applies it
        through `reporting_shim`."""
        return self._lensapp_relay is None or self._lensapp_relay.last

    def collect_nnsight(self, *args, **kwargs):
        if self._lensapp_relay is None or nnsight_has_reports_hook():
            return super().collect_nnsight(*args, **kwargs)
        with reporting_shim(self._reports_saves()):
            return super().collect_nnsight(*args, **kwargs)


def nnsight_has_reports_hook() -> bool:
    """nnsight's runner asks `self._reports_saves()` who reports a trace's saves (the upstream patch applied)."""
    from nnsight.modeling.vllm.model_runners.GPUModelRunner import NNsightGPUModelRunner

    return hasattr(NNsightGPUModelRunner, "_reports_saves")


@contextlib.contextmanager
def reporting_shim(reports: bool):
    """The one monkeypatch, until nnsight has the hook: nnsight 0.8.1's `collect_nnsight` decides inline
    (`reporting = get_pp_group().rank == 0`) and no method our runner overrides reaches that line, so during
    one collect the `get_pp_group` that its module calls answers rank 0 on the reporting stage, 1 elsewhere.
    docs/upstream/nnsight-reports-saves.patch is the smallest change to nnsight that makes this unneeded."""
    from nnsight.modeling.vllm.model_runners import GPUModelRunner as runner_module  # noqa: N813

    real = runner_module.get_pp_group
    runner_module.get_pp_group = functools.partial(types.SimpleNamespace, rank=0 if reports else 1)
    try:
        yield
    finally:
        runner_module.get_pp_group = real
