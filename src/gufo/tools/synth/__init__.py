"""`gufo synth`: random-weight GGUF files of real model shapes, in llama-quantize's type mixes.

presets (the shapes) and type_mix (the per-tensor types) are light; plan and writer build and write the
file. Import each from its module: `gufo synth --help` loads only the first two."""
