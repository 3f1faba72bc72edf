"""boto3 clients, made on first use (importing boto3 costs a noticeable fraction of a second,
and a provider that is only listed or configured never needs it)."""

from __future__ import annotations

import threading
from typing import Any

from gpulayer_aws.errors import aws_errors
from gpulayer_aws.settings import AwsSettings

# The Pricing API answers from a few regions only; us-east-1 serves every region's prices.
PRICING_REGION = "us-east-1"


class Clients:
    """One boto3 session and one client per (service, region), shared by threads: boto3
    clients are thread-safe, sessions are not, so clients are made under a lock."""

    def __init__(self, settings: AwsSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._session: Any = None
        self._clients: dict[tuple[str, str], Any] = {}

    def ec2(self, region: str) -> Any:
        return self._client("ec2", region)

    def pricing(self) -> Any:
        return self._client("pricing", PRICING_REGION)

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        client = self._clients.get(key)
        if client is not None:
            return client
        with self._lock, aws_errors(region):
            client = self._clients.get(key)
            if client is None:
                client = self._make(service, region)
                self._clients[key] = client
        return client

    def _make(self, service: str, region: str) -> Any:
        import boto3
        from botocore.config import Config

        if self._session is None:
            self._session = boto3.session.Session(profile_name=self._settings.profile)
        config = Config(
            retries={"mode": "standard", "max_attempts": self._settings.max_attempts},
            connect_timeout=10,
            read_timeout=60,
            user_agent_extra="gpulayer",
        )
        return self._session.client(
            service,
            region_name=region,
            endpoint_url=self._settings.endpoint_url,
            config=config,
        )
