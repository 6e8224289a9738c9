"""The torch-free description of a run: model shapes, presets and their resolution, the run config schema and its loader. The only part of the trainer gpucli imports."""
