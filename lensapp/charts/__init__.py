"""Altair charts of lens results: layer x token heatmaps, both lenses side by side and their
difference, target curves, generations, and several prompts compared.

Each public function takes a `results` object and returns a finished Altair chart (what `gr.Plot`
shows and `chart.to_dict()` tests). Display choices live in `DisplaySettings`. Nothing here runs a
model or imports torch; it only arranges numbers already in a result.

    tokens.py   token text made visible and unique     grid.py     the heatmap every chart draws
    lens.py     one prompt's charts                     compare.py  several prompts side by side
    intervention.py  before and after an intervention, their difference, the dose-response curve
    components.py  who wrote a logit: by layer, by head, and a layer's attention patterns
    sublayers.py   the logit lens inside each layer: rows L.attn and L.mlp
    decisions.py  where each token was decided (the strip under a heatmap), where branches part
"""

from . import components, intervention
from .compare import compare_heatmaps, compare_targets
from .decisions import branch_divergence, decision_strip
from .grid import LENS_TITLES, METRICS, DisplaySettings, Grid, Highlight, Metric, window_of
from .lens import generation_heatmap, lens_diff, lens_heatmap, lens_pair, lens_table, target_curves, top1_curves
from .sublayers import sublayer_heatmap
from .tokens import clip, column_labels, display_tokens, show_token

__all__ = ["LENS_TITLES", "METRICS", "DisplaySettings", "Grid", "Highlight", "Metric", "branch_divergence", "clip",
           "column_labels", "compare_heatmaps", "compare_targets", "components", "decision_strip", "display_tokens",
           "generation_heatmap", "intervention", "lens_diff", "lens_heatmap", "lens_pair", "lens_table", "show_token",
           "sublayer_heatmap", "target_curves", "top1_curves", "window_of"]
