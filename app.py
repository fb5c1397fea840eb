"""Lens Explorer: the Gradio app.

    python app.py                                   # the embedded SmolLM2-135M-Instruct on CPU, 127.0.0.1:7860
    python app.py --jlens assets/smollm2-135m-instruct_jlens.pt
    python app.py --model Qwen/Qwen3-8B             # GPU; its published Jacobian lens is loaded by default
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=8080 python app.py

Config -> engine -> UI -> launch. The engine (and vLLM's EngineCore and worker processes) is
started inside main(), never at import: vLLM's spawned processes re-import this module. It is
closed on exit, on SIGTERM and on Ctrl-C, so no engine process outlives the app.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import signal
import sys
import threading

from lensapp import config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Lens Explorer: logit lens, Jacobian lens and generation readouts "
                                                 "in the browser.")
    config.add_arguments(parser)
    parser.add_argument("--host", help="interface to listen on [env GRADIO_SERVER_NAME, default 127.0.0.1]")
    parser.add_argument("--port", type=int, help="port [env GRADIO_SERVER_PORT, default 7860]")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config.from_args(args)
    except config.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config.prepare_process_environment()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from lensapp import ui
    from lensapp.engine import Engine
    from lensapp.jlens import LensFileError

    engine = None
    closed = threading.Lock()

    def shutdown() -> None:
        if engine is not None and closed.acquire(blocking=False):
            engine.close()

    def on_signal(signum, frame):
        raise KeyboardInterrupt      # launch() catches it and stops the server; `finally` closes the engine

    atexit.register(shutdown)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"Starting the engine ({cfg.model}, {cfg.backend}); the first start takes about a minute...", flush=True)
    try:
        engine = Engine.from_config(cfg)
        demo = ui.build_app(engine, cfg)
        # As many handlers at once as the engine runs in one forward: it batches the lens requests waiting.
        demo.queue(default_concurrency_limit=cfg.max_batch, max_size=128)
        demo.launch(server_name=cfg.host, server_port=cfg.port, css=ui.CSS, head=ui.HEAD, footer_links=["api", "gradio"])
    except (LensFileError, config.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
