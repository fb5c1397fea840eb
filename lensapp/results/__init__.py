"""Result objects every surface shares: the CLI prints them, the UI renders them, the API returns them.

    lens.py        LensResult: one prompt, every requested lens x layer x position (and its targets)
    generation.py  GenerationResult (a readout per generated token) and ChatReply
    compare.py     Comparison: several prompts side by side, aligned at their last token
    intervention.py  InterventionResult: a prompt read before and after a steer, ablation or patch, and what
                   was done (InterventionDone: SteerDone, AblateDone, PatchDone)
    export.py      JSON and CSV text

`from_*` classmethods are the only code that touches the engine's tensors.
"""

from .compare import Comparison
from .export import dumps
from .generation import ChatReply, GenerationResult, GenerationStep
from .intervention import AblateDone, FitReport, InterventionDone, InterventionResult, PatchDone, SteerDone
from .lens import LensReadout, LensResult, Target, TargetScore

__all__ = ["AblateDone", "ChatReply", "Comparison", "FitReport", "GenerationResult", "GenerationStep",
           "InterventionDone", "InterventionResult", "LensReadout", "LensResult", "PatchDone", "SteerDone", "Target",
           "TargetScore", "dumps"]
