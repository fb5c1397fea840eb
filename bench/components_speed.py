"""What a components readout costs against the plain lens of the same prompt, and what one layer's patterns add.

On the service (the embedded model on vLLM by default, no result cache), after one untimed round of each, for a
17-token and a 256-token prompt:
  lens          the plain all-layer logit lens of the prompt, through the engine (its parts, as the app cuts them)
  components    the components readout at the last position: every layer's attention, head and MLP part
                and each head's most attended positions (one trace)
  + patterns    the same with one layer's attention weights among every position (heads x positions^2)
Goals: components <= 1.5 x lens; the patterns of one layer at 256 tokens reported (they are computed from the
queries and keys the kernel receives: heads x 256^2 weights). Medians of --repeats. The last line is one
JSON object.

    python bench/components_speed.py [--repeats 5] [--layer 23]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import median_time  # noqa: E402

from lensapp import config  # noqa: E402

SHORT = "The Eiffel Tower is located in the city of Paris, which is the capital of"          # 17 tokens
LONG_PARAGRAPH = ("The history of science is the study of the development of science and scientific knowledge, "
                  "including both the natural and social sciences. Science is a body of empirical, theoretical, "
                  "and practical knowledge about the natural world, produced by scientists who emphasize the "
                  "observation, explanation, and prediction of real-world phenomena. ")



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layer", type=int, default=23, help="the layer whose patterns are read")
    config.add_arguments(parser, ("model", "backend", "device", "dtype", "cache_dir"))
    args = parser.parse_args(argv)
    config.prepare_process_environment()

    from lensapp.service import ComponentsRequest, LensService, planning

    cfg = config.replace(config.from_args(args), cache_entries=0, jlens="none", max_work=1 << 30)
    service = LensService.start(cfg)
    service.wait_ready(1800)
    try:
        info = service.info
        tokenizer = service.prompts.tokenizer
        long_ids = tokenizer(LONG_PARAGRAPH * 8, add_special_tokens=False)["input_ids"][:256]
        texts = {"short": SHORT, "long": tokenizer.decode(long_ids, skip_special_tokens=True)}
        got, sizes = {}, {}
        for name, text in texts.items():
            ids = service.prompts.ids(text)
            sizes[name] = len(ids)
            spec = planning.lens_spec(ids, list(range(info.n_layers)), 5, ("logit",), info.n_layers, [])
            ask = ComponentsRequest(prompt=text, target="Paris")
            with_patterns = ComponentsRequest(prompt=text, target="Paris", patterns=args.layer)
            got[f"{name}_lens"] = median_time(lambda spec=spec: service.engine.lens([spec]), args.repeats)
            got[f"{name}_components"] = median_time(lambda ask=ask: service.components(ask), args.repeats)
            got[f"{name}_patterns"] = median_time(lambda ask=with_patterns: service.components(ask), args.repeats)
    finally:
        service.close()
    for name in texts:
        got[f"{name}_components/lens"] = got[f"{name}_components"] / got[f"{name}_lens"]
        got[f"{name}_patterns-components"] = got[f"{name}_patterns"] - got[f"{name}_components"]
    print(f"the embedded model's {info.n_layers} layers x {info.d_model}, {info.backend} ({info.dtype}), "
          f"medians of {args.repeats}; prompts of {sizes['short']} and {sizes['long']} tokens; patterns of layer "
          f"{args.layer}:")
    for name, value in got.items():
        print(f"  {name:28s} {value:.3f}" + ("" if "/" in name else " s"))
    print(json.dumps({"tokens": sizes, "repeats": args.repeats, "layer": args.layer,
                      **{k: round(v, 4) for k, v in got.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
