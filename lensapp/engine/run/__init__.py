"""What runs a model: the engine core, its backends, the trace bodies, pipeline stages, families, weights."""
