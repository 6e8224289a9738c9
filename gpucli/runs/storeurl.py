"""A checkpoint store's URL, checked where a launch is read (``--store``, the user config's ``store``):
``s3://BUCKET[/PREFIX]`` or ``hf://[datasets/]OWNER/NAME[/PREFIX]`` (gpucli/store/objstore.py)."""

from __future__ import annotations

from gpucli.errors import UsageError
from gpucli.store.objstore import StoreError, parse_url


def store_url(text: str | None) -> str | None:
    """The URL in its one spelling, or None; a UsageError (one line) for one that is not a store."""
    if text is None or not str(text).strip():
        return None
    try:
        return str(parse_url(text))
    except StoreError as exc:
        raise UsageError(str(exc), hint="e.g. --store s3://my-bucket/runs (credentials: AWS_ACCESS_KEY_ID, "
                                        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) or --store hf://me/ckpts (HF_TOKEN)") from None
