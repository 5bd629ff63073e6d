"""The job's Delta output as delta-rs (the `deltalake` package) sees it: where a path the
Spark session writes (a local path or `s3a://bucket/key`) is for delta-rs, and with which
storage options, taken from the session's Hadoop S3A settings (`consumers.spark.session.
s3a_conf`, or a cluster's own), so that the driver can make a small Delta commit itself,
without a Spark job (`consumers.spark.job_state`).

delta-rs commits a version by creating its log file only if it does not exist yet (a local
rename that refuses to replace, S3's conditional put), as Spark's Delta does: the two write
the same log, and each reads what the other wrote.
"""

from __future__ import annotations

from typing import Any

S3A = "s3a://"


def rs_location(spark: Any, path: str) -> tuple[str, dict[str, str]]:
    """(URI, storage options) of the Delta table at `path` for delta-rs: a local path as it
    is (no options); `s3a://b/k` as `s3://b/k` with the endpoint, region and credentials of
    the session's `fs.s3a.*` settings (unset ones are left to delta-rs's defaults: the AWS
    environment, profile or instance credentials)."""
    if not path.startswith(S3A):
        return path, {}
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()

    def get(key: str) -> str:
        return str(hadoop.get(key) or "")

    options: dict[str, str] = {}
    endpoint = get("fs.s3a.endpoint")
    if endpoint:
        if "://" not in endpoint:  # Hadoop takes a bare host; https unless ssl is off
            ssl = get("fs.s3a.connection.ssl.enabled").lower() != "false"
            endpoint = ("https://" if ssl else "http://") + endpoint
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if get("fs.s3a.path.style.access").lower() == "true":
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    region = get("fs.s3a.endpoint.region")
    if region:
        options["AWS_REGION"] = region
    key, secret = get("fs.s3a.access.key"), get("fs.s3a.secret.key")
    if key and secret:
        options["AWS_ACCESS_KEY_ID"] = key
        options["AWS_SECRET_ACCESS_KEY"] = secret
        token = get("fs.s3a.session.token")
        if token:
            options["AWS_SESSION_TOKEN"] = token
    return "s3://" + path[len(S3A):], options
