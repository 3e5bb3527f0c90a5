"""An S3-compatible server on loopback for tests: moto's standalone server, with real auth.

Authentication is switched on (moto's INITIAL_NO_AUTH_ACTION_COUNT): the first three calls
create an IAM user, its policy and its access key; every request after that is signed and
checked, so wrong credentials fail as they would against S3.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass
class S3Server:
    port: int = 0
    access_key: str = ""
    secret_key: str = ""
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> S3Server:
        from conveyor.testing.pgserver import free_port

        self.port = self.port or free_port()
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"moto server did not start on port {self.port}") from None
                time.sleep(0.1)
        self._make_user()
        return self

    def _make_user(self) -> None:
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="conveyor")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="conveyor", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="conveyor")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def env(self) -> dict[str, str]:
        """The standard AWS variables s3fs (and Conveyor) read."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):  # a boto3 client
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
