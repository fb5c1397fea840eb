"""Lens Explorer: the web app (`lensapp serve`), runnable from a checkout or a Hugging Face Space.

    python app.py                                   # the embedded SmolLM2-135M-Instruct on CPU, 127.0.0.1:7860
    python app.py --model Qwen/Qwen3-8B             # GPU; its published Jacobian lens is loaded by default
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=8080 python app.py

Guarded: vLLM's spawned processes re-import this module.
"""

import sys

from lensapp.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
