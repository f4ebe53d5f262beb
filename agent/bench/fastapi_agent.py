"""Minimal FastAPI agent for `make bench-agent`: the same `POST /v1/exec` as orchard-agent's argv form
(subprocess in its own session, output captured), served by uvicorn. The baseline the paper's agent
style would give; not used anywhere else."""

import asyncio
import os
import signal
import sys
import time
from typing import Dict, List, Optional

import uvicorn
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel

app = FastAPI()
TOKEN = os.environ.pop("BENCH_TOKEN", "")


class ExecRequest(BaseModel):
    argv: List[str]
    cwd: Optional[str] = None
    env: Optional[Dict[str, str]] = None
    timeoutSeconds: float = 600


@app.get("/healthz")
async def healthz():
    return {"status": "ok"}


@app.post("/v1/exec")
async def execute(request: ExecRequest, authorization: str = Header(default="")):
    if TOKEN and authorization != f"Bearer {TOKEN}":
        raise HTTPException(status_code=401)
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *request.argv,
        cwd=request.cwd,
        env={**os.environ, **(request.env or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), request.timeoutSeconds)
    except asyncio.TimeoutError:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = await process.communicate()
    return {
        "exitCode": process.returncode if process.returncode >= 0 else None,
        "signal": -process.returncode if process.returncode < 0 else None,
        "timedOut": timed_out,
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
        "durationMs": int((time.monotonic() - started) * 1000),
    }


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
