"""A run's checkpoint store (S3-compatible or the Hugging Face Hub): the client both sides use
(:mod:`objstore`) and the pod's uploader (:mod:`storesync`). Nothing here imports gpucli: both files are
copied to the pod and run there as they are."""
