"""Filesystems through fsspec: local paths, ``s3://`` (s3fs), ``memory://`` and any other.

Credentials come from the standard places each filesystem reads (for S3: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, profiles) or from
``storage_options`` (use ``${oc.env:VAR}`` for secrets there). S3 filesystems are built
fresh for each job (no instance cache), so changed credentials are never served stale.
Errors name the path or bucket, never a credential.
"""

from __future__ import annotations

from typing import Any

from conveyor.errors import ConfigError, ConnectError, ConveyorError, SchemaError, TransferError, first_line

_EXTRA = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}


def protocol_of(path: str) -> str:
    return path.split("://", 1)[0] if "://" in path else "file"


def filesystem(path: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(filesystem, path inside it) for an fsspec URL."""
    import fsspec

    options = dict(storage_options or {})
    if protocol_of(path) in ("s3", "s3a"):
        options.setdefault("skip_instance_cache", True)
        endpoint = options.pop("endpoint_url", None)
        if endpoint:  # s3fs wants the endpoint in client_kwargs, as botocore does
            options.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    try:
        return fsspec.core.url_to_fs(path, **options)
    except ImportError as exc:
        extra = _EXTRA.get(protocol_of(path))
        hint = f"pip install 'conveyor[{extra}]'" if extra else f"install the fsspec implementation for {protocol_of(path)}://"
        raise ConfigError(f"path {path!r}: {exc}", key="path", hint=hint) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"path {path!r}: {exc}", key="path") from None


def display(fs: Any, path: str) -> str:
    """A path as the user would write it (with its protocol, except for local files)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else fs.unstrip_protocol(path)


def translate(exc: BaseException, where: str) -> ConveyorError:
    """A filesystem error as one Conveyor error naming the path or bucket."""
    if isinstance(exc, ConveyorError):
        return exc
    text = first_line(exc)
    local = getattr(exc, "errno", None) is not None  # the operating system's own error: a local file
    if isinstance(exc, FileNotFoundError):
        return ConfigError(f"{where}: not found: {text}", hint="check the path" if local else "check the path and that the bucket exists")
    if isinstance(exc, PermissionError):
        if local:
            import getpass

            return ConnectError(f"{where}: access denied: {text}",
                                hint=f"check the permissions of that file or folder for user {getpass.getuser()}")
        return ConnectError(f"{where}: access denied: {text}",
                            hint="check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options)")
    import errno

    code = getattr(exc, "errno", None)
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):  # a read-only file system (or permission an OSError, not PermissionError, says)
        return ConnectError(f"{where}: cannot write there: {text}",
                            hint="write to a folder on a writable file system (a read-only mount, or one the user may not write)")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return TransferError(f"{where}: the disk is full: {text}", retriable=False,
                             hint="free space on that file system (df -h shows it), or write elsewhere")
    name = type(exc).__name__
    if name in ("EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError") or isinstance(exc, ConnectionError):
        return ConnectError(f"{where}: cannot reach the storage: {text}", hint="check storage_options.endpoint_url and the network")
    if name in ("ClientError", "NoCredentialsError"):
        return ConnectError(f"{where}: {text}", hint="check the credentials and the bucket")
    if local:  # another error of the operating system's (an I/O error, too many open files): not the data's shape
        return TransferError(f"{where}: {name}: {text}", retriable=False, hint="the operating system refused it: fix the cause, then run it again")
    return SchemaError(f"{where}: {name}: {text}")


def version(info: dict[str, Any]) -> str:
    """What tells one version of a file from another, from an fsspec ``info``: its size and its ETag
    (object stores) or modification time."""
    tag = next((info[k] for k in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "updated", "created")
                if info.get(k) is not None), "")
    return f"{info.get('size')}:{tag}"
