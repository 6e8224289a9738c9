"""A run's files between its machine and this one: which checkpoint is which, bringing them home, the export, the
checkpoint store, the bytes a launch moves, serving and TensorBoard, reading a stopped pod."""
