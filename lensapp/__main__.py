from .cli import main

# Guarded: vLLM may spawn processes that re-import the main module.
if __name__ == "__main__":
    raise SystemExit(main())
