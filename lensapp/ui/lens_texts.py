"""The words of the logit-lens and Jacobian-lens tabs: each tab's two-sentence intro, its "How to read this", the
page shown where no Jacobian lens is loaded, and the options' explanations (`lens_tab.py` lays them out)."""

# Both tabs: the column a BOS rule adds (service/prompts.py reads every prompt so when the lens was fitted so).
BOS_COLUMN = """
- A first column such as `<|im_start|>` or `<s>` is the tokenizer's start token (BOS), not your text: the
  Jacobian lens loaded was fitted with it before every prompt, so every tab reads every prompt with it first.
  The model parks attention there; its cells say little.
"""[1:]

LOGIT_HOW_TO = """
Each **row** is a layer (layer 0 at the bottom, the last layer at the top) and each **column** a prompt
token. A cell shows the token the model would predict *next* if it stopped at that layer: the layer's
residual stream sent through the model's own final norm and unembedding. The colour is the metric you
choose; hover a cell for its top-k.

- Read a column bottom to top to watch a prediction form. The top row is the model's real output.
- `␣` is a space, `↵` a newline, `⇥` a tab: tokens often start with a space.
- *Skip punctuation and whitespace* shows each cell's best word instead of a `.` or `␣`, with its rank as a
  superscript (`␣city³`: rank 3); the hover still lists the true top-k, and the colour is still the metric's.
- Early layers of most models read out noise or the current token itself; that is expected.
- *KL to final* is how far a layer's guess is from the model's final distribution (0 = the same).
- *Target* metrics score the first token of each target word as it would follow the prompt (a leading
  space is added).
""" + BOS_COLUMN

JACOBIAN_HOW_TO = """
The **logit lens** reads layer *l* as if the layers after it did nothing. The **Jacobian lens** first moves
the residual into the last layer's basis with a pre-fitted average Jacobian J_l = E[∂h_final / ∂h_l],
then unembeds: what the model is *disposed* to say from layer *l*, not what it would say if it stopped there.

- Both heatmaps share rows (layers that have a J), columns (prompt tokens) and the colour scale.
- The **difference** view marks cells whose top-1 differs. Orange: the J-lens is closer to the model's
  final distribution there (lower KL); blue: the logit lens is. Grey: both lenses agree.
- **Early layers read out degenerate tokens under the J-lens** (runs of `____`, punctuation, the same
  token everywhere): an average Jacobian fitted from far below carries little of the prompt. Read it from
  the middle layers on.
- The top layer has no J (J = I there), so both lenses agree on it by construction.
""" + BOS_COLUMN

NO_LENS = """
### No Jacobian lens is loaded

This tab compares the logit lens with a **Jacobian lens**, a set of pre-fitted matrices that belongs to
one model. None was configured when the app started, so there is nothing to show here.

To load one, restart the app with `--jlens`:

- a lens file for this model: `lensapp serve --jlens path/to/lens.pt`
  (make one with `lensapp fit ...`; the embedded model's ships with the app);
- a published lens on the Hugging Face hub, with `--model Qwen/Qwen3-8B`:
  `--jlens neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt`.

The same setting can come from the environment: `LENSAPP_JLENS=...`.
"""

# Above the chart: what the picture is, in two plain sentences ("How to read this" says the rest).
LOGIT_INTRO = ("The picture below reads a prompt layer by layer: each row is a layer of the model (the first at "
               "the bottom) and each column a word piece of the prompt. A cell is the word the model would say "
               "next if it stopped at that layer, so a column read upward shows the answer forming: for *The "
               "capital of France is*, ␣Paris takes over in the top layers.")
JACOBIAN_INTRO = ("The same picture through the Jacobian lens, beside the plain logit lens: each layer is first "
                  "carried to the last layer by a fitted average Jacobian, so a cell is what that layer is "
                  "disposed to say. The view under it marks the cells where the two lenses disagree.")
RAW_INFO = ("Unembed with h·W_U alone, skipping the model's own logit soft-capping or scaling (the same as the "
            "default for models that have none).")
SUBLAYERS_INFO = ("Rows L.attn (after the layer's attention) between rows L.mlp (after its MLP): which half of a "
                  "layer wrote a prediction.")
