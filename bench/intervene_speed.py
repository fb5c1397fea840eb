"""What an intervention costs: an edited readout against the plain one, and a sweep against one request per alpha.

On the service (the embedded model on vLLM by default, no result cache), after one untimed round of each:
  plain         an all-layer logit lens of the prompt (one trace)
  edited        the same spec with one `add` edit at one layer, run through the engine (one trace)
  intervene 1   a steering request with one alpha: the readout before and after (two traces, batched)
  sweep N       one steering request with N alphas (N + 1 traces, batched)
  N requests    N steering requests of one alpha each, one after another
Goals: edited <= 1.3 x plain (the edit adds one vector per layer); sweep N < N requests. Medians of
--repeats. The last line is one JSON object.

    python bench/intervene_speed.py [--repeats 5] [--alphas 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import median_time  # noqa: E402

from lensapp import config  # noqa: E402

PROMPT = "The Eiffel Tower is located in the city of Paris, which is the capital of"



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--alphas", type=int, default=5)
    parser.add_argument("--layer", type=int, default=22)
    args = parser.parse_args(argv)
    config.prepare_process_environment()

    import torch

    from lensapp.engine.run.edit import Edit
    from lensapp.service import InterveneRequest, LensService, planning

    service = LensService.start(config.Config.of(cache_entries=0, jlens="none"))
    service.wait_ready(900)
    try:
        info = service.info
        ids = service.prompts.ids(PROMPT)
        spec = planning.lens_spec(ids, list(range(info.n_layers)), 5, ("logit",), info.n_layers, [])
        vector = torch.randn(info.d_model) * 10
        edited = dataclasses.replace(spec, edits=(Edit(args.layer, "add", vector),))
        alphas = [round(0.1 * (i + 1), 2) for i in range(args.alphas)]

        def steer(values):
            return service.intervene(InterveneRequest(prompt=PROMPT, intervention="steer", word="Rome",
                                                      layer=str(args.layer), alphas=tuple(values)))

        got = {
            "plain": median_time(lambda: service.engine.lens([spec]), args.repeats),
            "edited": median_time(lambda: service.engine.lens([edited]), args.repeats),
            "intervene_1": median_time(lambda: steer(alphas[:1]), args.repeats),
            f"sweep_{args.alphas}": median_time(lambda: steer(alphas), args.repeats),
            f"requests_{args.alphas}": median_time(lambda: [steer([a]) for a in alphas], args.repeats),
        }
    finally:
        service.close()
    got["edited/plain"] = got["edited"] / got["plain"]
    got["sweep/requests"] = got[f"sweep_{args.alphas}"] / got[f"requests_{args.alphas}"]
    print(f"{len(ids)}-token prompt, every layer, logit lens, vLLM ({info.dtype}), medians of {args.repeats}:")
    for name, value in got.items():
        print(f"  {name:14s} {value:.3f}" + ("" if "/" in name else " s"))
    print(json.dumps({"tokens": len(ids), "repeats": args.repeats, **{k: round(v, 4) for k, v in got.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
