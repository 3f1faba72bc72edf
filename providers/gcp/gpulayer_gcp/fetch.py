"""Stage `gs://bucket/name` job inputs: one object, or every object under a prefix.

Found by the worker through the entry-point group `gpulayer.fetchers`, so gs:// inputs work
wherever gpulayer-gcp is installed. Credentials come from Application Default Credentials
(GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, a machine's service account); with
STORAGE_EMULATOR_HOST set, the client talks to that emulator without credentials.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from gpulayer.cloud import NotFoundError, UsageError


def parse_gs_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme != "gs" or not parts.netloc:
        raise UsageError(f"inputs: {url!r} is not a gs://bucket/name URL")
    return parts.netloc, parts.path.lstrip("/")


def fetch_gs(url: str, destination: Path) -> None:
    from google.api_core.exceptions import NotFound
    from google.cloud import storage  # type: ignore[attr-defined]

    bucket_name, name = parse_gs_url(url)
    client = storage.Client()
    bucket = client.bucket(bucket_name)
    if name and not name.endswith("/"):
        try:
            bucket.blob(name).download_to_filename(str(destination))
            return
        except NotFound:
            destination.unlink(missing_ok=True)  # the client leaves an empty file behind
        name += "/"  # not an object: perhaps a folder of them
    found = 0
    for blob in client.list_blobs(bucket_name, prefix=name):
        relative = PurePosixPath(blob.name[len(name) :])
        if not relative.parts or ".." in relative.parts or blob.name.endswith("/"):
            continue
        target = destination.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
        found += 1
    if not found:
        raise NotFoundError(f"no object at gs://{bucket_name}/{name}")
