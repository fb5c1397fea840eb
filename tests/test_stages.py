"""Pipeline stages (engine/run/stages.py) without an engine: the residual of a block's output, the stand-ins for
other stages' modules, which stage a trace is on, and the relay on a two-stage split of a real torch model
(the engine tests, tests/test_parallel.py, run it inside vLLM's workers)."""

from __future__ import annotations

import pytest
import torch

from lensapp.engine.run import stages


def test_a_blocks_residual_sums_vllms_pairs():
    h, r = torch.ones(2, 3), torch.full((2, 3), 2.0)
    assert torch.equal(stages.stream((h, r)), h + r)
    assert torch.equal(stages.stream((h, None)), h) and torch.equal(stages.stream(h), h)


def test_other_stages_modules_stand_in_and_nothing_else_does():
    here = torch.nn.Linear(2, 2)
    ids = stages.StandIns({"Module:model.model.layers.0": here, "Interleaver": object()})
    assert ids["Module:model.model.layers.0"] is here
    assert "Module:model.model.layers.3.self_attn" in ids and "Module:model.logits_processor" in ids
    assert not stages.runs_here(ids["Module:model.logits_processor"])
    assert "Tokenizer" not in ids
    with pytest.raises(KeyError):
        ids["Tokenizer"]


def test_outside_vllm_every_trace_is_on_the_last_stage():
    assert stages.is_last_stage()


class Stage(torch.nn.Module):
    """A decoder's blocks as vLLM lays them out on one stage: [start, end) real, the rest placeholders."""

    def __init__(self, blocks, start: int, end: int):
        super().__init__()
        from vllm.model_executor.models.utils import PPMissingLayer

        self.start_layer, self.end_layer = start, end
        self.layers = torch.nn.ModuleList([b if start <= i < end else PPMissingLayer() for i, b in enumerate(blocks)])


def test_the_relay_carries_each_earlier_layer_to_the_last_stage_in_order():
    """Stage 0 (layers 0-1) records its outputs and ships them; stage 1 fires layers 0-1's placeholders with
    them before its own forward, so a hook there sees exactly what stage 0's blocks returned."""
    from vllm.sequence import IntermediateTensors

    torch.manual_seed(0)
    blocks = [torch.nn.Linear(4, 4) for _ in range(4)]
    first, last = Stage(blocks, 0, 2), Stage(blocks, 2, 4)
    sender, receiver = stages.StageRelay(first, True, False), stages.StageRelay(last, False, True)
    x = torch.randn(3, 4)
    want = []
    for layer in range(2):
        x = first.layers[layer](x)
        want.append(x)
    sent = sender.after_forward(IntermediateTensors({"hidden_states": x}))
    assert stages.RESIDUALS in sent.tensors
    seen = []
    for layer in range(2):
        last.layers[layer].register_forward_hook(lambda m, a, out: seen.append(out))
    kept = receiver.take(dict(sent.tensors))
    assert set(kept) == {"hidden_states"}                 # what vLLM copies into its buffers
    receiver.before_forward(3, paired=False)
    assert len(seen) == 2 and all(torch.equal(s, w) for s, w in zip(seen, want))


def test_the_reporting_shim_answers_collects_rank_for_one_call_only():
    """nnsight 0.8.1 has no hook for who reports a trace's saves: the shim stands in for its rank check during
    one collect, and puts nnsight's own `get_pp_group` back after it, even when the collect raised."""
    from nnsight.modeling.vllm.model_runners import GPUModelRunner as runner_module  # noqa: N813

    real = runner_module.get_pp_group
    for reports, rank in ((True, 0), (False, 1)):
        with pytest.raises(RuntimeError), stages.reporting_shim(reports):
            assert runner_module.get_pp_group().rank == rank
            raise RuntimeError("a collect that failed")
        assert runner_module.get_pp_group is real


def test_the_upstream_hook_patch_applies_to_the_installed_nnsight(tmp_path):
    """docs/upstream/nnsight-reports-saves.patch is a diff against the nnsight this project runs: it still
    applies, and with it applied the runner's own `_reports_saves` is the hook (no shim needed)."""
    import shutil
    import subprocess
    from pathlib import Path

    import nnsight

    if shutil.which("patch") is None:
        pytest.skip("no `patch` program on this machine")
    target = tmp_path / "nnsight/modeling/vllm/model_runners/GPUModelRunner.py"
    target.parent.mkdir(parents=True)
    shutil.copy(Path(nnsight.__file__).parent / "modeling/vllm/model_runners/GPUModelRunner.py", target)
    diff = Path(__file__).resolve().parents[1] / "docs/upstream/nnsight-reports-saves.patch"
    done = subprocess.run(["patch", "-p1", "-d", str(tmp_path), "-i", str(diff)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = target.read_text()
    assert "reporting = self._reports_saves()" in text and "def _reports_saves(self)" in text
    assert not stages.nnsight_has_reports_hook()            # the installed one is unpatched: the shim is in use
