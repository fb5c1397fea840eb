"""Result objects every surface shares: the CLI prints them, the UI renders them, the API returns them.

    lens.py        LensResult: one prompt, every requested lens x layer x position (and its targets)
    readout.py     LensReadout: one lens's cells (top-k, entropy, KL, decisions), its TargetScores
    generation.py  GenerationResult (a readout per generated token) and ChatReply
    compare.py     Comparison: several prompts side by side, aligned at their last token
    intervention.py  InterventionResult: a prompt read before and after a steer, ablation or patch, and what
                   was done (InterventionDone: SteerDone, AblateDone, PatchDone)
    components.py  ComponentsResult: who wrote one logit (embedding, attention layers and heads, MLPs)
    export.py      JSON and CSV text
    decided.py     where each token was decided: the layer from which a lens reads it to the last
    branching.py   a generation branched at a forced token, and where two generations part
    description.py a cell described in words (Patchscopes)

`from_*` classmethods are the only code that touches the engine's tensors.
"""

from .compare import Comparison
from .components import ComponentsResult
from .description import Description, Descriptions
from .export import dumps
from .generation import ChatReply, GenerationResult, GenerationStep
from .intervention import AblateDone, FitReport, InterventionDone, InterventionResult, PatchDone, SteerDone
from .lens import LensResult
from .readout import LensReadout, Target, TargetScore

__all__ = ["AblateDone", "ChatReply", "Comparison", "ComponentsResult", "Description", "Descriptions", "FitReport",
           "GenerationResult",
           "GenerationStep", "InterventionDone", "InterventionResult", "LensReadout", "LensResult", "PatchDone",
           "SteerDone", "Target", "TargetScore", "dumps"]
