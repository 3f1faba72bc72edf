"""Stage `s3://bucket/key` job inputs: one object, or every object under a prefix ending in /.

Found by the worker through the entry-point group `gpulayer.fetchers`, so s3:// inputs work
wherever gpulayer-aws is installed. Credentials and endpoint come from boto3's default chain
(AWS_PROFILE, instance roles, AWS_ENDPOINT_URL_S3, ...).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from gpulayer.cloud import NotFoundError, UsageError


def parse_s3_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise UsageError(f"inputs: {url!r} is not an s3://bucket/key URL")
    return parts.netloc, parts.path.lstrip("/")


def fetch_s3(url: str, destination: Path) -> None:
    import boto3
    from botocore.exceptions import ClientError

    bucket, key = parse_s3_url(url)
    client = boto3.client("s3")
    if key and not key.endswith("/"):
        try:
            client.download_file(bucket, key, str(destination))
            return
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("404", "NoSuchKey", "NotFound"):
                raise
        key += "/"  # not an object: perhaps a folder of them
    found = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        for item in page.get("Contents", []):
            relative = PurePosixPath(item["Key"][len(key) :])
            if not relative.parts or ".." in relative.parts or item["Key"].endswith("/"):
                continue
            target = destination.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(target))
            found += 1
    if not found:
        raise NotFoundError(f"no object at s3://{bucket}/{key}")
