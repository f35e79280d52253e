"""api.redis_pipeline.PipelinedRedis against a Redis of its own: scripts, errors, restarts."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from api.redis_pipeline import PipelinedRedis
from infra.process import free_port
from infra.services import redis_binary

SCRIPT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


class OwnRedis:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--save", "", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def test_pipelined_scripts_errors_and_restart(own_redis: OwnRedis) -> None:
    async def scenario() -> None:
        client = PipelinedRedis(f"redis://127.0.0.1:{own_redis.port}/2", timeout=1.0)
        results = await asyncio.gather(*(client.evalsha(SCRIPT, ["n"], [1]) for _ in range(200)))
        assert sorted(results) == list(range(1, 201))  # one connection, replies in order
        with pytest.raises(ResponseError):
            await client.execute("NOSUCHCOMMAND")
        assert await client.execute("GET", "n") == "200"  # still in sync after an error
        own_redis.stop()
        with pytest.raises(RedisConnectionError):
            await client.evalsha(SCRIPT, ["n"], [1])
        own_redis.start()  # fresh server: scripts are reloaded on NOSCRIPT
        assert await client.evalsha(SCRIPT, ["n"], [5]) == 5
        await client.close()

    asyncio.run(scenario())
