"""gpulayer's Amazon EC2 provider. Importing this package does not import boto3; the first
API call does."""

from gpulayer_aws.catalog import refresh_catalog
from gpulayer_aws.provider import AwsProvider
from gpulayer_aws.settings import AwsSettings

__all__ = ["AwsProvider", "AwsSettings", "refresh_catalog"]
